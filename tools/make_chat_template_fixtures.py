#!/usr/bin/env python3
"""Goldens for ramtrain's Jinja chat-template renderer (src/data/jinja_*.cpp).

Reads the real chat templates in tests/fixtures/chat_templates/templates.json
(each with the public file it was copied from, or a note where the text is
from memory: Gemma-1's) and renders every template on
a set of conversations with transformers' own renderer
(transformers.utils.chat_template_utils.render_jinja_template, what
apply_chat_template calls), writing tests/fixtures/chat_templates/cases.json:
  {"versions": {...}, "now": "YYYY-MM-DD HH:MM:SS", "cases": [
     {"name", "template" (key into templates.json), "messages", "tools" (or null),
      "add_generation_prompt", "kwargs" (bos_token, eos_token, date_string,
      enable_thinking, reasoning_effort, ...), "expected" (text) or "error"
      (raise_exception text)}]}
Families: Llama-3.1/3.2, Qwen2.5/3, Mistral-Nemo/v0.3, Gemma-1/2 (a system turn
raises), Gemma-3 (the system turn folds into the first user turn; list
content), Phi-3-mini/medium, Phi-3.5, Phi-4, Phi-4-mini (tools in the system
message), gpt-oss (harmony: channels analysis/commentary/final, developer and
system messages, tool calls, reasoning_effort / model_identity /
builtin_tools).
strftime_now is pinned to "now" (transformers reads datetime.now(); the C++
test pins its clock to the same instant in UTC).

Usage: python -m venv .venv && .venv/bin/pip install transformers jinja2
       .venv/bin/python tools/make_chat_template_fixtures.py
"""
import datetime as _dt
import json
import os

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat_templates")
NOW = _dt.datetime(2025, 3, 7, 12, 0, 0)


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


ctu.datetime = _PinnedDatetime  # strftime_now reads chat_template_utils.datetime.now()

SPECIAL = {  # the special-token strings apply_chat_template passes for each family
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5": {"bos_token": None, "eos_token": "<|im_end|>"},
    "qwen3": {"bos_token": None, "eos_token": "<|im_end|>"},
    "mistral-nemo": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "gemma2": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "phi3.5": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi3-medium": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi4": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
    "phi4-mini": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user_assistant": [
        {"role": "system", "content": "You are a terse assistant.  "},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    "multi_turn": [
        {"role": "user", "content": "  Hi there\n"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about \"quotes\" and 'apostrophes'."},
        {"role": "assistant", "content": "Why did the quote break up? It felt {{ escaped }}.\n"},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 日本語もOK 🙂"},
        {"role": "user", "content": "Ça va? \t tab and \\ backslash"},
        {"role": "assistant", "content": "Très bien — merci! 🎉"},
    ],
    "tools": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 °C and clear in Zürich."},
    ],
    "two_user_turns": [  # two user turns in a row: Mistral's templates refuse it
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
    "system_content_parts": [  # Gemma-3 reads list content: {"type": "text"} parts (and images)
        {"role": "system", "content": [{"type": "text", "text": "  Be brief. "}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?\n"}]},
        {"role": "assistant", "content": [{"type": "text", "text": " A cat. "}]},
    ],
    "phi4_mini_tools": [  # Phi-4-mini takes the tool list as a JSON string in the system message
        {"role": "system", "content": "You can call tools.",
         "tools": json.dumps([WEATHER_TOOL["function"]], ensure_ascii=False)},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}]"},
    ],
    "harmony": [  # gpt-oss: developer instructions, reasoning in "thinking", several turns
        {"role": "developer", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "thinking": "The user asks for the capital; it is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome.", "thinking": "Italy's capital is Rome."},
    ],
    "harmony_tools": [  # gpt-oss: a tool call in the commentary channel, its result, the final answer
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "thinking": "I should call get_weather.", "tool_calls": [
            {"id": "call1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 °C.", "thinking": "The tool says 21.5."},
    ],
    "harmony_channel_in_content": [  # gpt-oss refuses channel tags inside content
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<|channel|>final<|message|>Hello"},
    ],
    "harmony_tool_without_call": [  # gpt-oss: a tool result needs an earlier tool call
        {"role": "user", "content": "Hi"},
        {"role": "tool", "content": "42"},
    ],
    "harmony_tool_call_content_and_thinking": [  # gpt-oss: one analysis message per tool call
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me look.", "thinking": "Look it up.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}]},
    ],
    "thinking": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
        {"role": "user", "content": "And 21?"},
        {"role": "assistant", "content": "No: 21 = 3 x 7.", "reasoning_content": "3 divides 21."},
    ],
}

# Which conversations each template renders (the others raise by design).
PLAN = {
    "llama3.1": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools"],
    "llama3.2": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools"],
    "qwen2.5": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools"],
    "qwen3": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools", "thinking"],
    "mistral-nemo": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools"],
    "mistral-v0.3": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools"],
    "gemma2": ["user_only", "multi_turn"],
    "phi3.5": ["user_only", "system_user_assistant", "multi_turn", "unicode"],
    "gemma": ["user_only", "multi_turn"],
    "gemma3": ["user_only", "system_user_assistant", "multi_turn", "unicode", "system_content_parts"],
    "phi3": ["user_only", "system_user_assistant", "multi_turn", "unicode"],
    "phi3-medium": ["user_only", "system_user_assistant", "multi_turn", "unicode"],
    "phi4": ["user_only", "system_user_assistant", "multi_turn", "unicode"],
    "phi4-mini": ["user_only", "system_user_assistant", "multi_turn", "unicode", "phi4_mini_tools"],
    "gpt-oss": ["user_only", "system_user_assistant", "multi_turn", "unicode", "tools", "thinking", "harmony",
                "harmony_tools"],
}
ERRORS = {  # conversations a template refuses with raise_exception
    "gemma2": ["system_user_assistant"],
    "gemma": ["system_user_assistant"],
    "gemma3": ["two_user_turns"],
    "gpt-oss": ["harmony_channel_in_content", "harmony_tool_without_call", "harmony_tool_call_content_and_thinking"],
    "mistral-v0.3": ["two_user_turns"],
}


def render(template, messages, tools, agp, kwargs):
    out, _ = ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                       add_generation_prompt=agp, **kwargs)
    return out[0]


def main():
    templates = json.load(open(os.path.join(ROOT, "templates.json"), encoding="utf-8"))
    cases = []
    for name, plan in PLAN.items():
        tpl = templates[name]["template"]
        for conv in plan + ERRORS.get(name, []):
            messages = CONVERSATIONS[conv]
            variants = [(False, {}), (True, {})]
            if name == "llama3.2":
                variants.append((True, {"date_string": "01 Jan 2025"}))
            if name == "qwen3":
                variants.append((True, {"enable_thinking": False}))
            if name == "gpt-oss" and conv in ("harmony", "tools"):
                variants.append((False, {"reasoning_effort": "high"}))
                variants.append((True, {"reasoning_effort": "low", "model_identity": "You are a test model.",
                                        "builtin_tools": ["browser", "python"]}))
            for agp, extra in variants:
                tools = [WEATHER_TOOL] if conv in ("tools", "harmony_tools") else None
                kwargs = dict(SPECIAL[name], **extra)
                case = {"name": f"{name}/{conv}/gen={int(agp)}" + "".join(f"/{k}={v}" for k, v in extra.items()),
                        "template": name, "messages": messages, "tools": tools,
                        "add_generation_prompt": agp, "kwargs": kwargs}
                try:
                    case["expected"] = render(tpl, messages, tools, agp, kwargs)
                except jinja2.exceptions.TemplateError as e:
                    if conv not in ERRORS.get(name, []):
                        raise
                    case["error"] = str(e)
                cases.append(case)
    doc = {"versions": {"transformers": transformers.__version__, "jinja2": jinja2.__version__},
           "now": NOW.strftime("%Y-%m-%d %H:%M:%S"), "cases": cases}
    path = os.path.join(ROOT, "cases.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
