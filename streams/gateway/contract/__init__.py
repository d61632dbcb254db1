"""The HTTP contract: request and reply models, and the table of operations.

One definition per shape. ``requests.py`` holds the request bodies as msgspec Structs, and
every body is decoded through its model (``decode.model``, errors in the path form of
``fields.py``): the enqueue bodies, schedules, retries, cancels, reruns, workflow events and the
worker protocol (``worker_requests.py``); each parser then checks what no type states and
hands its handler plain values. The reply bodies, the field types and the limits are
``conveyor.contract`` (``sdk/contract/``: ``replies.py``, ``shapes.py``, ``limits.py``), on the
SDK's side, because the SDK decodes replies with the same models. ``operations.py`` is one row
per route; ``openapi.py`` writes the documents from the rows and the models.

Rule 1: the document never allows what the node refuses, nor refuses what it takes. What a
type cannot state is a model's ``rules`` (JSON Schema ``not``/``if``) and a check after decoding;
``tests/unit/test_contract.py`` feeds bodies generated from the document to the parsers, and
the fuzz tests send them to a node.
Rule 2: a new route needs a row (the same test compares the rows with the app's routes).

Why msgspec, not pydantic v2: msgspec is already a dependency (typed payloads), its Structs
are the cheapest objects to build, and ``msgspec.json.schema_components`` writes the
components the document needs. Decoding and validating an enqueue batch of 100 items (the
hot path) went from 1,577 to 1,204 us (min of 5 rounds of 200, alternating, same process,
after ``fields.parse_json``'s 671 us; the hand-written ``Fields`` validator before), so the
contract costs nothing on the enqueue path. pydantic would add a second validation runtime
and its schemas would need the same ``rules`` added by hand.
"""
