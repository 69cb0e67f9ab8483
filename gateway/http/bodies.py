"""JSON request bodies as typed ``data`` parameters.

Litestar documents a handler's ``data`` annotation as the operation's OpenAPI requestBody.
Its own decoding would answer a bad body with Litestar's validation error, so the handlers
that take a body name one of the two DTOs below instead of Litestar's:

- `JsonBody` decodes the body into the annotated type with `schemas.decode`; a bad body is
  a 400 in OpenAI's error shape naming the parameter (see `decode_body`). Routes that use it
  authenticate in a guard, which Litestar runs before it reads the body.
- `DeferredBody[T]` documents ``T`` and hands the raw bytes to the handler, which decodes
  them itself after authentication (the OpenAI routes, whose refusals are all audited).

Neither builds Litestar's transfer models: the structs in `schemas` / `admin_schemas` are
the wire format already.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import msgspec
from litestar import Request
from litestar.dto import AbstractDTO
from litestar.typing import FieldDefinition

from gateway.http.contract import body_reference
from gateway.http.schemas import BodyError, decode
from gateway.http.strict import strict_query
from gateway.serving.errors import invalid

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.dto._backend import DTOBackend
    from litestar.dto.data_structures import DTOFieldDefinition
    from litestar.openapi.spec import Reference, Schema

T = TypeVar("T")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`(?: - at `\$\.(?P<at>.+)`)?")


def _struct_in(annotation: Any) -> Any:
    """The first struct type in an annotation (``G | None``, ``list[G]``, ``Annotated[G, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return next((s for a in get_args(annotation) if (s := _struct_in(a)) is not None), None)


def _struct_at(kind: Any, path: str | None) -> Any:
    """The struct type at a msgspec error path such as ``guard`` or ``messages[0]``."""
    kind = _struct_in(kind)
    for part in filter(None, re.split(r"\.|\[\d+\]", path or "")):
        if kind is None:
            return None
        fields = {f.encode_name: f.type for f in msgspec.structs.fields(kind)}
        kind = _struct_in(fields.get(part))
    return kind


def _unknown_field(exc: BodyError, kind: Any) -> BodyError:
    """An unknown field is named, with the fields that are allowed where it was sent."""
    found = _UNKNOWN.fullmatch(exc.message)
    where = _struct_at(kind, found.group("at")) if found else None
    if found is None or where is None:
        return exc
    name, at = found.group("name"), found.group("at")
    allowed = ", ".join(sorted(where.__struct_encode_fields__))
    return BodyError(f"unknown field '{name}' (allowed: {allowed})", f"{at}.{name}" if at else name)


def decode_body(body: bytes, kind: Any) -> Any:
    """Decode a JSON body into ``kind`` or raise the 400 (GatewayError) that names the problem:
    an empty body, malformed JSON, a wrong type or missing field (msgspec's message, the
    field's path as ``param``), or an unknown field (with the allowed ones)."""
    try:
        return decode(body, kind)
    except BodyError as exc:
        err = _unknown_field(exc, kind)
        raise invalid(err.message, err.param) from None


def sent(body: msgspec.Struct) -> dict[str, Any]:
    """The fields the client sent, as the plain dict the serving layer validates (fields
    left at ``msgspec.UNSET`` are omitted, at every depth)."""
    return msgspec.to_builtins(body)  # type: ignore[no-any-return]


async def require_body(request: Request[Any, Any, Any]) -> None:
    """before_request hook: an empty body is refused like any bad body (Litestar would skip
    the DTO and report a missing ``data`` parameter instead); query strings are checked as
    everywhere (`strict.strict_query`: a router's hook replaces the app's)."""
    await strict_query(request)
    if request.route_handler.parsed_data_field is not None and not await request.body():
        decode_body(b"", dict)


class JsonBody(AbstractDTO[T]):
    """Decode ``data`` into the handler's annotated type with `decode_body`."""

    @classmethod
    def generate_field_definitions(
        cls, model_type: type[Any]
    ) -> Generator[DTOFieldDefinition, None, None]:
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        return False

    @classmethod
    def create_for_field_definition(
        cls,
        field_definition: FieldDefinition,
        handler_id: str,
        backend_cls: type[DTOBackend] | None = None,
    ) -> None:
        """Nothing to build: the annotated type is decoded as it is."""

    @classmethod
    def documented_type(cls, field_definition: FieldDefinition) -> Any:
        return field_definition.annotation

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: SchemaCreator
    ) -> Reference | Schema:
        kind = cls.documented_type(field_definition)
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            return body_reference(kind)
        documented = FieldDefinition.from_annotation(
            kind,
            name=field_definition.name,
            kwarg_definition=field_definition.kwarg_definition,
        )
        return schema_creator.for_field_definition(documented)

    def decode_bytes(self, value: bytes) -> Any:
        data_field = self.asgi_connection.route_handler.parsed_data_field
        return decode_body(value, data_field.annotation)


class DeferredBody(JsonBody[T]):
    """Document ``T`` (``DeferredBody[T]``); the handler gets the raw bytes (``data: bytes``)
    and decodes them itself."""

    @classmethod
    def documented_type(cls, field_definition: FieldDefinition) -> Any:
        return cls.model_type

    def decode_bytes(self, value: bytes) -> Any:
        return value
