"""Typed handlers: how a handler's signature takes its payload, and how values cross the wire.

The wire carries JSON. A handler's annotations say what its payload becomes on the way in and
how its result is encoded on the way out, so payloads and results may be dataclasses,
TypedDicts, NamedTuples, msgspec Structs, pydantic models, enums, datetimes, UUIDs and the
containers of them, as well as plain JSON values.

Binding rules, decided when ``@app.task`` runs (a signature that fits none is refused then,
with what to change, never at the first attempt):

1. The context. The first positional parameter receives the ``Context`` when it is annotated
   ``Context`` or named ``ctx`` or ``context``.
2. The payload. What is left of the positional parameters decides:
   - none: the task takes no payload (``def tick(ctx)``, ``def tick()``); any payload sent is
     ignored;
   - one: that parameter is the payload (``def resize(ctx, image: Image)``);
   - two or more: arguments, Celery's way (``def add(x: int, y: int)``): the payload is a JSON
     array of them in order, or an object of them by name; missing ones take their defaults.
   A keyword-only parameter without a default is refused (nothing could pass it), and so is
   an annotation the decoder cannot build (it says which).
3. Decoding. Each payload value is converted to its parameter's annotation (no annotation, or
   ``Any``: the JSON value as is). A payload that does not fit fails the attempt with
   ``PayloadInvalid``, a ``FatalError``: sending it again cannot help, so it is not retried.
   Annotations that name a type defined later in the module are resolved at the first call.
4. Encoding. A payload given to ``enqueue`` and a handler's result are turned into JSON values
   the same way: pydantic models by ``model_dump(mode="json")``, everything else by
   ``msgspec.to_builtins`` (plain JSON values pass unchanged). ``TaskHandle.result()``
   decodes the result to the handler's return annotation (for ``async def``: what it awaits).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec

from conveyor.errors import ContractError, FatalError

CONTEXT_NAMES = frozenset({"ctx", "context"})
_PLAIN = (str, int, float, bool, type(None))
_NOTHING = inspect.Parameter.empty


class PayloadInvalid(FatalError):
    """The payload does not fit the handler's parameters (rule 3)."""


class ResultNotSerializable(FatalError):
    """The handler returned something that is not a JSON value once encoded (rule 4)."""


@dataclasses.dataclass(frozen=True)
class _Param:
    name: str
    annotation: Any  # _NOTHING: take the JSON value as is
    default: Any  # _NOTHING: required


@dataclasses.dataclass
class Binding:
    """How one handler takes its context and payload (the rules of this module)."""

    task: str
    fn: Callable[..., Any]
    context: bool
    params: list[_Param]
    returns: Any
    var_positional: bool = False
    var_keyword: bool = False
    _resolved: bool = False

    @property
    def style(self) -> str:
        """``none``, ``payload`` or ``arguments`` (rule 2)."""
        if not self.params and not self.var_positional:
            return "none"
        if len(self.params) == 1 and not self.var_positional:
            return "payload"
        return "arguments"

    def call(self, ctx: Any, payload: Any) -> Any:
        """Call the handler with ``payload`` decoded (rule 3); its result as it returned it."""
        self._resolve()
        args: list[Any] = [ctx] if self.context else []
        kwargs: dict[str, Any] = {}
        style = self.style
        if style == "payload":
            args.append(self._decode_param(self.params[0], payload))
        elif style == "arguments":
            more, kwargs = self._arguments(payload)
            args += more
        return self.fn(*args, **kwargs)

    def check(self, payload: Any) -> None:
        """Refuse ``payload`` as ``call`` would (``PayloadInvalid``), without calling: a
        client's check of a payload it sends encoded, which the node cannot check."""
        self._resolve()
        if self.style == "payload":
            self._decode_param(self.params[0], payload)
        elif self.style == "arguments":
            self._arguments(payload)

    def encode_result(self, value: Any) -> Any:
        try:
            return encode(value)
        except ContractError as exc:
            raise ResultNotSerializable(f"task {self.task!r} returned {exc}") from None

    def decode_result(self, value: Any) -> Any:
        self._resolve()
        if self.returns is _NOTHING or (value is None and _allows_none(self.returns)):
            return value
        try:
            return _convert(value, self.returns)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            raise ContractError(
                f"the result of task {self.task!r} does not fit its return annotation: {exc}"
            ) from None

    def _arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        if payload is None:
            payload = {}
        if isinstance(payload, list):
            if len(payload) > len(self.params) and not self.var_positional:
                raise PayloadInvalid(
                    f"task {self.task!r} takes {len(self.params)} arguments, the payload has "
                    f"{len(payload)}"
                )
            named = dict(zip((p.name for p in self.params), payload, strict=False))
            extra = payload[len(self.params) :]
        elif isinstance(payload, dict):
            named, extra = dict(payload), []
        else:
            raise PayloadInvalid(
                f"task {self.task!r} takes arguments ({', '.join(p.name for p in self.params)}):"
                f" send a JSON array of them or an object by name, not a {type(payload).__name__}"
            )
        args: list[Any] = []
        for p in self.params:
            if p.name in named:
                args.append(self._decode_param(p, named.pop(p.name)))
            elif p.default is not _NOTHING:
                args.append(p.default)
            else:
                raise PayloadInvalid(f"task {self.task!r}: the payload lacks argument {p.name!r}")
        if named and not self.var_keyword:
            raise PayloadInvalid(
                f"task {self.task!r} has no argument {sorted(named)[0]!r} (it takes "
                f"{', '.join(p.name for p in self.params)})"
            )
        return args + extra, named

    def _decode_param(self, p: _Param, value: Any) -> Any:
        if p.annotation is _NOTHING:
            return value
        try:
            return _convert(value, p.annotation)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            where = "the payload" if self.style == "payload" else f"argument {p.name!r}"
            raise PayloadInvalid(f"task {self.task!r}: {where} is invalid: {exc}") from None

    def _resolve(self) -> None:
        """Rule 3's late resolution of annotations that named a type defined later."""
        if self._resolved:
            return
        hints = _hints(self.fn, self.task, strict=True)
        self.params = [
            dataclasses.replace(p, annotation=_annotation(hints, p.name)) for p in self.params
        ]
        self.returns = _result_type(hints.get("return", _NOTHING), self.fn)
        for p in self.params:
            _check_decodable(self.task, p.name, p.annotation)
        self._resolved = True


def bind(fn: Callable[..., Any], task: str) -> Binding:
    """The binding of ``fn`` (rules 1 and 2), or ``ContractError`` saying what to change."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C callables: the classic (ctx, payload)
        return Binding(task, fn, True, [_Param("payload", _NOTHING, _NOTHING)], _NOTHING)
    hints = _hints(fn, task, strict=False)
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in params:
        if p.kind is p.KEYWORD_ONLY and p.default is _NOTHING:
            raise ContractError(
                f"task {task!r}: keyword-only parameter {p.name!r} has no default, and nothing "
                "could pass it: give it a default or make it positional"
            )
    context = bool(positional) and _is_context(positional[0], hints)
    rest = positional[1:] if context else positional
    binding = Binding(
        task,
        fn,
        context,
        [_Param(p.name, _annotation(hints, p.name), p.default) for p in rest],
        _result_type(hints.get("return", _NOTHING), fn),
        var_positional=any(p.kind is p.VAR_POSITIONAL for p in params),
        var_keyword=any(p.kind is p.VAR_KEYWORD for p in params),
    )
    if binding.style == "arguments" and any(p.kind is p.POSITIONAL_ONLY for p in rest):
        raise ContractError(
            f"task {task!r}: arguments sent by name cannot fill positional-only parameters "
            "(drop the '/')"
        )
    if not _unresolved(fn, hints):
        for param in binding.params:
            _check_decodable(task, param.name, param.annotation)
        binding._resolved = True
    return binding


def encode(value: Any) -> Any:
    """``value`` as a JSON value (rule 4); ``ContractError`` if it cannot be one."""
    if isinstance(value, _PLAIN):
        return value
    try:
        return msgspec.to_builtins(value, enc_hook=_enc_hook)
    except TypeError as exc:
        raise ContractError(f"a {type(value).__name__} is not a JSON value: {exc}") from None


def _pydantic(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "model_validate") and hasattr(cls, "model_fields")


def _enc_hook(value: Any) -> Any:
    if _pydantic(type(value)):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot encode a {type(value).__name__}")


def _convert(value: Any, annotation: Any) -> Any:
    if annotation is Any:
        return value
    if _pydantic(annotation):
        return annotation.model_validate(value)
    return msgspec.convert(value, annotation, strict=False, dec_hook=_dec_hook)


def _dec_hook(annotation: Any, value: Any) -> Any:
    if _pydantic(annotation):
        return annotation.model_validate(value)  # a pydantic model inside a container
    raise TypeError(f"cannot build a {annotation!r}")


def _check_decodable(task: str, name: str, annotation: Any) -> None:
    if annotation is _NOTHING or annotation is Any or _pydantic(annotation):
        return
    try:
        why = "" if not _custom(msgspec.inspect.type_info(annotation)) else "no decoder for it"
    except (TypeError, ValueError) as exc:
        why = str(exc)
    if why:
        raise ContractError(
            f"task {task!r}: parameter {name!r} is annotated {annotation!r}, which a JSON "
            f"payload cannot become ({why}); use JSON types, a dataclass, TypedDict, msgspec "
            "Struct or pydantic model"
        )


def _custom(info: Any) -> bool:
    """Whether ``info`` (msgspec's view of a type) holds a type it cannot build."""
    if isinstance(info, msgspec.inspect.CustomType):
        return not _pydantic(info.cls)
    for attr in ("item_type", "key_type", "value_type"):
        inner = getattr(info, attr, None)
        if inner is not None and _custom(inner):
            return True
    for inner in getattr(info, "types", ()) or ():
        if isinstance(inner, msgspec.inspect.Type) and _custom(inner):
            return True
    return any(_custom(f.type) for f in getattr(info, "fields", ()) or ())


def _hints(fn: Callable[..., Any], task: str, *, strict: bool) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except NameError as exc:
        if strict:
            raise PayloadInvalid(
                f"task {task!r}: an annotation of its handler cannot be resolved: {exc}"
            ) from None
        return {}
    except TypeError:
        return {}


def _unresolved(fn: Callable[..., Any], hints: dict[str, Any]) -> bool:
    """Whether ``fn`` has annotations ``_hints`` could not resolve yet (rule 3)."""
    return bool(getattr(fn, "__annotations__", None)) and not hints


def _annotation(hints: dict[str, Any], name: str) -> Any:
    annotation = hints.get(name, _NOTHING)
    return _NOTHING if annotation is Any else annotation


def _result_type(annotation: Any, fn: Callable[..., Any]) -> Any:
    if annotation is _NOTHING or annotation is Any:
        return _NOTHING
    if inspect.iscoroutinefunction(fn):
        return annotation  # get_type_hints gives what the coroutine returns
    origin = typing.get_origin(annotation)
    if origin in (Coroutine, Awaitable):
        args = typing.get_args(annotation)
        return args[-1] if args else _NOTHING
    return annotation


def _allows_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation)


def _is_context(param: inspect.Parameter, hints: dict[str, Any]) -> bool:
    from conveyor.context import Context

    annotation = hints.get(param.name, param.annotation)
    if annotation is Context:
        return True
    if isinstance(annotation, str) and annotation.rpartition(".")[2] == "Context":
        return True
    return param.name in CONTEXT_NAMES
