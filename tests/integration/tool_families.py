"""Chat templates modelled on each tool-calling family's published template (written here
for the tests: the turn markers, where the tools are listed, how an assistant's calls and
the tool results are rendered), and a manifest serving the tiny pair once per family.
Mistral's two templates are here: v0.3's ``[TOOL_CALLS] [{...}]`` with call ids, and the
tokenizer-v11 one (Mistral Small 3.2, Magistral, Devstral): ``[TOOL_CALLS]f[ARGS]{...}``
per call, results in ``[TOOL_RESULTS]…[/TOOL_RESULTS]``.
gpt-oss's (harmony) renders a call as a commentary message to ``functions.f`` (with the
thinking before it, sent back as ``reasoning_content``, which its template reads as
``thinking``, as an analysis message) and its
result as a message from ``functions.f``; its model thinks first, so the tenants of the
families' gateway cap the thinking (`cap_thinking`).

The templates follow their family in what the gateway depends on: the call syntax the
model is taught (which `detect_format` reads), the roles that carry tool results (Llama's
``ipython``, Mistral's ``[TOOL_RESULTS]`` with the call id, Granite's ``tool_response``,
Qwen's ``<tool_response>`` in a user turn) and Mistral's refusal of call ids that are not
9 characters. Turn markers are plain text for the tiny tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import yaml

from tests.integration import tiny_models

QWEN = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}{% if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user\
{% endif %}
{{- '\\n' }}<tool_response>
{{ m.content }}
</tool_response>{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif %}
{%- elif not (tools and loop.first and m.role == 'system') %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}\
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3 = """{{- '<|begin_of_text|>' }}<|start_header_id|>system<|end_header_id|>

{% if tools %}Environment: ipython
{% endif %}Cutting Knowledge Date: December 2023

{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|eot_id|>
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'user' and tools and loop.index0 <= 1 %}<|start_header_id|>user<|end_header_id|>

Given the following functions, please respond with a JSON for a function call with its \
proper arguments that best answers the given prompt.

Respond in the format {"name": function name, "parameters": dictionary of argument name \
and its value}. Do not use variables.

{% for tool in tools %}{{ tool | tojson }}

{% endfor %}{{ m.content }}<|eot_id|>
{%- elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for c in m.tool_calls %}{% if not loop.first %}; {% endif %}{"name": "{{ c.function.name }}", \
"parameters": {{ c.function.arguments | tojson }}}{% endfor %}<|eom_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{% if m.content is mapping %}{{ m.content | tojson }}{% else %}{{ m.content }}{% endif %}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """{%- set ns = namespace(last=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}\
{% endfor %}
{{- '<s>' }}
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.index0 == ns.last %}\
[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}\
[INST] {{ m.content }}[/INST]
{%- elif m.tool_calls %}[TOOL_CALLS] [
{%- for c in m.tool_calls %}
{%- if c.id is not string or c.id | length != 9 %}\
{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}
{%- if not loop.first %}, {% endif %}{"name": "{{ c.function.name }}", "arguments": \
{{ c.function.arguments | tojson }}, "id": "{{ c.id }}"}
{%- endfor %}]</s>
{%- elif m.role == 'tool' %}
{%- if m.tool_call_id | length != 9 %}\
{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}\
[TOOL_RESULTS] {"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}\
[/TOOL_RESULTS]
{%- elif m.role == 'assistant' %} {{ m.content }}</s>
{%- endif %}
{%- endfor %}"""

MISTRAL_V11 = """{{- '<s>' }}
{%- if messages[0].role == 'system' %}[SYSTEM_PROMPT]{{ messages[0].content }}[/SYSTEM_PROMPT]\
{% endif %}
{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' %}{% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}
{%- set arguments = c.function.arguments %}
{%- if arguments is not string %}{% set arguments = arguments | tojson %}\
{% elif arguments == '' %}{% set arguments = '{}' %}{% endif %}
{{- '[TOOL_CALLS]' + c.function.name + '[ARGS]' + arguments }}
{%- endfor %}</s>
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]
{%- elif m.role != 'system' %}{{ raise_exception('Only user, assistant and tool roles') }}
{%- endif %}
{%- endfor %}"""

GRANITE = """{%- if tools %}<|start_of_role|>available_tools<|end_of_role|>
{% for tool in tools %}{{ tool | tojson(indent=4) }}
{% endfor %}<|end_of_text|>
{% endif %}<|start_of_role|>system<|end_of_role|>\
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are Granite, \
developed by IBM. You are a helpful AI assistant with access to the following tools. When a \
tool is required to answer the user's query, respond with <|tool_call|> followed by a JSON \
list of tools used.{% endif %}<|end_of_text|>
{% for m in messages %}{% if m.role == 'system' %}
{%- elif m.role == 'tool' %}<|start_of_role|>tool_response<|end_of_role|>{{ m.content }}\
<|end_of_text|>
{% elif m.tool_calls %}<|start_of_role|>assistant<|end_of_role|><|tool_call|>[
{%- for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{"name": \
"{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}{% endfor %}]\
<|end_of_text|>
{% else %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}<|end_of_text|>
{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"""

PYTHONIC = """{%- macro py(v) %}{% if v is sameas true %}True{% elif v is sameas false %}False\
{% elif v is none %}None{% else %}{{ v | tojson }}{% endif %}{% endmacro -%}
<|begin_of_text|><|header_start|>system<|header_end|>

{% if tools %}You are an expert in composing functions. You are given a question and a set \
of possible functions. Based on the question, you will need to make one or more function/tool \
calls to achieve the purpose.
If you decide to invoke any of the function(s), you MUST put it in the format of \
[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]
You SHOULD NOT include any other text in the response.
Here is a list of functions in JSON format that you can invoke.
{{ tools | tojson }}
{% endif %}{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|eot|>
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.tool_calls %}<|header_start|>assistant<|header_end|>

[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{{ c.function.name }}(
{%- for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}\
{{ k }}={{ py(v) }}{% endfor %}){% endfor %}]<|eot|>
{%- elif m.role == 'tool' %}<|header_start|>ipython<|header_end|>

{{ m.content }}<|eot|>
{%- else %}<|header_start|>{{ m.role }}<|header_end|>

{{ m.content }}<|eot|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|header_start|>assistant<|header_end|>

{% endif %}"""

GPT_OSS = """{#- gpt-oss (harmony): channels analysis, commentary, final #}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n' }}
{{- 'Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n' }}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}
{%- if tools %}{{ '\\n' }}Calls to these tools must go to the commentary channel: \
'functions'.{% endif %}
{{- '<|end|>' }}
{%- if tools or messages[0].role == 'system' %}<|start|>developer<|message|>
{%- if messages[0].role == 'system' %}# Instructions

{{ messages[0].content }}

{% endif %}
{%- if tools %}# Tools

## functions

namespace functions {

{% for t in tools %}{% set f = t.function if t.function is defined else t %}\
{% if f.description %}// {{ f.description }}
{% endif %}type {{ f.name }} = (_: {{ f.parameters | tojson }}) => any;

{% endfor %}} // namespace functions{% endif %}<|end|>
{%- endif %}
{%- set last = namespace(name='') %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' and m.tool_calls %}
{%- set c = m.tool_calls[0].function %}
{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>\
{{ m.thinking }}<|end|>{% endif %}
{{- '<|start|>assistant to=functions.' + c.name + '<|channel|>commentary json<|message|>' }}
{{- c.arguments | tojson }}<|call|>
{%- set last.name = c.name %}
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>\
{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.{{ last.name }} to=assistant\
<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

TEMPLATES = {
    "hermes": QWEN,
    "llama3_json": LLAMA3,
    "mistral": MISTRAL,
    "mistral_v11": MISTRAL_V11,
    "granite": GRANITE,
    "pythonic": PYTHONIC,
    "harmony": GPT_OSS,
}
"""Each family's template, by the format it teaches."""
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
           "<|call|>")  # fmt: skip
"""gpt-oss's harmony markers (special tokens in its tokenizer; ``<|return|>`` and
``<|call|>`` end its outputs)."""
TAGS = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<|tool_call|>", "[ARGS]", *HARMONY)
"""The families' markers, added as whole tokens as their tokenizers have them."""
SPECIAL_TAGS = TAGS[1:]
"""The markers that are special tokens in their families' tokenizers (Qwen's <tool_call> is
an ordinary added token): decoded output text does not show them."""
DECLARED = "tiny-declared"
"""A target whose template is the demo's ChatML (Hermes) but whose manifest declares
``tool_format: mistral``."""


THINKING_CAP = 6
"""The thinking tokens a tenant of the families' gateway may spend (`cap_thinking`): the
tiny random model would not end an analysis message on its own."""


def cap_thinking(url: str, tenant: str) -> None:
    """Cap ``tenant``'s thinking at `THINKING_CAP` tokens (its policy's reasoning.max_tokens),
    so that gpt-oss's analysis ends and its answer or call follows."""
    from tests.integration.service.harness import ADMIN  # the service tests' admin key

    doc = {"reasoning": {"max_tokens": THINKING_CAP}}
    r = httpx.put(f"{url}/admin/policies/tenants/{tenant}", json=doc, headers=ADMIN)
    assert r.status_code == 200, r.text


def target(family: str) -> str:
    """The model name serving ``family``'s template."""
    return f"tiny-{family.replace('_', '-')}"


def _mark_special(path: Path) -> None:
    """Make the `SPECIAL_TAGS` special tokens in a saved tokenizer, as in their families."""
    data = json.loads(path.read_text())
    for token in data["added_tokens"]:
        if token["content"] in SPECIAL_TAGS:
            token.update(special=True, normalized=False)
    path.write_text(json.dumps(data))


def end_harmony_outputs(path: Path) -> None:
    """Make ``<|return|>`` and ``<|call|>`` end the outputs of the model saved at ``path``,
    as gpt-oss's generation config does."""
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    config_path = path / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    first = config.get("eos_token_id", 0)
    config["eos_token_id"] = [first, ids["<|return|>"], ids["<|call|>"]]
    config_path.write_text(json.dumps(config))


def build(root: Path) -> Path:
    """The tiny pair (every family's tag one token, 2,048-token context) served once per
    family: target ``tiny-<family>`` with that family's template and the random draft for it
    (so speculation rejects tokens), plus `DECLARED`. Returns the manifest's path."""
    base = tiny_models.build(root / "base", context=2048, extra_tokens=TAGS)
    raw = yaml.safe_load(base.read_text())["models"]
    for entry in raw:
        _mark_special(base.parent / entry["path"] / "tokenizer.json")
    by_role = {e["role"] + e["version"]: e for e in raw}
    entries = []
    families = [(target(f), t, None) for f, t in TEMPLATES.items()]
    families.append((DECLARED, tiny_models.CHAT_TEMPLATE, "mistral"))
    for name, template, declared in families:
        for role, source in (("target", by_role["target1"]), ("draft", by_role["draft2"])):
            path = root / f"{name}-{role}"
            shutil.copytree(base.parent / source["path"], path)
            (path / "chat_template.jinja").write_text(template)
            if template is GPT_OSS:
                end_harmony_outputs(path)
            entry = {**source, "name": f"{name}-{role}" if role == "draft" else name}
            entry.update(version="1", path=path.name)
            if role == "draft":
                entry["target"] = name
            elif declared:
                entry["tool_format"] = declared
            entries.append(entry)
    manifest = root / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    return manifest
