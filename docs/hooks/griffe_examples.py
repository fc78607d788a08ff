"""Griffe extension: a docstring's ``Example:`` section is read as ``Examples:``.

Keras and this project write ``Example:`` (singular) above a short runnable example. Griffe's
Google-style parser knows only ``Examples:`` as the section whose ``>>>`` lines are code with
their output; ``Example:`` it reads as an admonition of Markdown text, where each ``>>>`` became
a nested block quote and the output ran into the same line. This renames the heading in every
docstring as it is loaded (the source stays as it is), so each example renders as a code block.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


def as_examples(text: str) -> str:
    """``text`` with each ``Example:`` heading line made ``Examples:``.

    Example:
        >>> as_examples("Summary.\\n\\nExample:\\n    >>> 1 + 1\\n    2\\n")
        'Summary.\\n\\nExamples:\\n    >>> 1 + 1\\n    2\\n'
    """
    return _SINGULAR.sub(r"\g<indent>Examples:", text)


class ExampleSections(Extension):
    """Renames ``Example:`` to ``Examples:`` in each object's docstring (`as_examples`)."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = as_examples(obj.docstring.value)
