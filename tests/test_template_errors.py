"""A chat template that does not parse says why and where (llama.cpp rethrows its
parser's error as a bare std::exception)."""

from __future__ import annotations

import pytest

from pydflash import ChatTemplateError, Llama


@pytest.mark.parametrize(
    "template, line, column",
    [
        ("{% if %}", 1, 7),  # the condition is missing: the parser stops at %}
        ("{{ messages[0]['content'] }}\n{% for m in messages %}\n  {{ m.content }\n{% endfor %}", 3, None),
    ],
)
def test_the_error_names_the_line_and_column(target_path, template, line, column):
    col = r"\d+" if column is None else str(column)
    with Llama(target_path, n_ctx=64, chat_template=template) as llm:
        with pytest.raises(ChatTemplateError, match=rf"does not parse: line {line}, column {col}: \S") as err:
            llm.apply_chat_template([{"role": "user", "content": "hi"}])
        assert "std::exception" not in str(err.value)
        # the object stays usable
        assert llm.generate("x", max_tokens=2, ignore_eos=True).tokens
