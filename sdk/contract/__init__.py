"""The HTTP contract's shapes both sides use: the reply models, the field types and the limits.

``replies.py`` holds the reply bodies as msgspec Structs, ``shapes.py`` the field types they
and the request models share, ``limits.py`` the numbers the models state and the node checks.
The OpenAPI document is written from them, the SDK decodes what the node sends with them
(``conveyor.wire``: a reply the model refuses is a ContractError naming the field), and the
fuzz tests check every reply a real node sends against them: one definition per shape.

They live on the SDK's side so that ``pip install conveyor`` (no server extra) can decode
replies: this package imports msgspec and the light leaves ``conveyor.errors`` and
``conveyor.schemas`` only, never ``conveyor.streams`` or ``conveyor.store``. The node's half of
the contract (the request models, the route table, the document writer, the decoder that
reports errors in the gateway's path form) is ``conveyor.streams.gateway.contract``.
"""
