"""A JSON schema and prompts that invite JSON, for the grammar tests on the embedded pair."""

from __future__ import annotations

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPTS = ["person = ", "# a user record\nuser = ", "def load(path):\n    return ", "config = json.loads('"]
