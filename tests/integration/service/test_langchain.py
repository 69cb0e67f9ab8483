"""LangChain's `ChatOpenAI` against a real `python -m gateway` process, on every tool-call
format (one tiny target per family, tests/integration/tool_families.py): a pydantic model as
LangChain sends it (no ``additionalProperties``), bound as a forced tool
(``bind_tools([Person], tool_choice="Person")``) and as structured output
(``with_structured_output(Person, method="function_calling")``), comes back as a valid
call: LangChain parses it into ``tool_calls`` and into a ``Person``.

The fields carry bounds (``max_length``, ``ge``/``le``, as pydantic writes them) because a
random tiny model never decides to end a string or a number: unbounded, its calls run into
max_tokens, which says nothing about the gateway. What the schema leaves open (other keys)
is generated only where it says so (engine/constraints/objects.py), so no key is invented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.integration import tool_families
from tests.integration.service.process import tenant_key

langchain_openai = pytest.importorskip("langchain_openai")


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(description="The person's name", max_length=16)
    age: int = Field(description="Age in years", ge=0, le=150)


FAMILIES = list(tool_families.TEMPLATES)


@pytest.fixture(scope="module")
def server(tool_families_gateway: tuple[str, Path]) -> tuple[str, str]:
    url, _ = tool_families_gateway  # shared with test_tool_formats_api.py (conftest.py)
    key = tenant_key(url, "langchain")
    tool_families.cap_thinking(url, "langchain")  # gpt-oss's analysis ends
    return url, key


def _chat(server: tuple[str, str], family: str) -> Any:
    url, key = server
    return langchain_openai.ChatOpenAI(
        model=tool_families.target(family),
        base_url=f"{url}/v1",
        api_key=key,
        temperature=0,
        max_tokens=160,
        max_retries=0,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_bind_tools_with_a_forced_pydantic_tool(server: tuple[str, str], family: str) -> None:
    llm = _chat(server, family).bind_tools([Person], tool_choice="Person")
    message = llm.invoke("Ann is 31 years old.")
    assert not message.invalid_tool_calls, message.invalid_tool_calls
    (call,) = message.tool_calls
    assert call["name"] == "Person"
    assert set(call["args"]) == {"name", "age"}  # only the properties the model names
    jsonschema.validate(call["args"], Person.model_json_schema())


@pytest.mark.parametrize("family", FAMILIES)
def test_structured_output_by_function_calling(server: tuple[str, str], family: str) -> None:
    llm = _chat(server, family).with_structured_output(Person, method="function_calling")
    person = llm.invoke("Ann is 31 years old.")
    assert isinstance(person, Person)
    assert len(person.name) <= 16 and 0 <= person.age <= 150
