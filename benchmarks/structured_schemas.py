"""Twenty JSON schemas of varied shape, each with a prompt that asks for it.

Shared by the structured-output test (every output validates) and the
benchmark (compile time cold and cached). Every string has a maxLength and
every array a maxItems, so an output closes well before max_tokens.
"""

NAME = {"type": "string", "minLength": 1, "maxLength": 20}
SHORT = {"type": "string", "maxLength": 12}

SCHEMAS: list[tuple[str, dict]] = [
    (
        "Describe a person.",
        {
            "type": "object",
            "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"],
        },
    ),
    (
        "Is the sky blue? Answer as JSON.",
        {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]},
    ),
    (
        "Pick a primary colour.",
        {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}},
            "required": ["colour"],
        },
    ),
    (
        "List two to four fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {"type": "array", "items": SHORT, "minItems": 2, "maxItems": 4}
            },
            "required": ["fruits"],
        },
    ),
    (
        "Give a city and its country.",
        {
            "type": "object",
            "properties": {
                "city": NAME,
                "location": {
                    "type": "object",
                    "properties": {"country": NAME, "continent": NAME},
                    "required": ["country"],
                },
            },
            "required": ["city", "location"],
        },
    ),
    (
        "Rate a film from 1 to 5.",
        {
            "type": "object",
            "properties": {"title": NAME, "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["title", "stars"],
        },
    ),
    (
        "Give a temperature in Celsius.",
        {
            "type": "object",
            "properties": {"celsius": {"type": "integer", "minimum": -50, "maximum": 50}},
            "required": ["celsius"],
        },
    ),
    (
        "Give a user, with an optional nickname.",
        {
            "type": "object",
            "properties": {"user": NAME, "nickname": SHORT},
            "required": ["user"],
        },
    ),
    (
        "Give either a number or a word.",
        {
            "type": "object",
            "properties": {
                "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, SHORT]}
            },
            "required": ["value"],
        },
    ),
    (
        "Give three small numbers.",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 3,
            "maxItems": 3,
        },
    ),
    (
        "Describe a book.",
        {
            "type": "object",
            "properties": {
                "title": NAME,
                "author": NAME,
                "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
            },
            "required": ["title", "author", "year"],
        },
    ),
    (
        "Give a shopping list of one or two items with quantities.",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": SHORT,
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["name", "qty"],
                    },
                }
            },
            "required": ["items"],
        },
    ),
    (
        "Say hello in one word.",
        {"type": "string", "maxLength": 10},
    ),
    (
        "What is the status of the server?",
        {
            "type": "object",
            "properties": {
                "status": {"enum": ["up", "down", "degraded"]},
                "code": {"type": "integer", "enum": [200, 500, 503]},
            },
            "required": ["status", "code"],
        },
    ),
    (
        "Give a point on a grid.",
        {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -10, "maximum": 10},
                "y": {"type": "integer", "minimum": -10, "maximum": 10},
            },
            "required": ["x", "y"],
        },
    ),
    (
        "Name a pet, a cat or a dog.",
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"cat": NAME},
                    "required": ["cat"],
                },
                {
                    "type": "object",
                    "properties": {"dog": NAME},
                    "required": ["dog"],
                },
            ]
        },
    ),
    (
        "Give a percentage.",
        {
            "type": "object",
            "properties": {"percent": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": ["percent"],
        },
    ),
    (
        "Give a yes/no flag and a reason.",
        {
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "reason": {"type": ["string", "null"], "maxLength": 20},
            },
            "required": ["ok", "reason"],
        },
    ),
    (
        "Give a matrix of zeros and ones, two by two.",
        {
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": {
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "integer", "enum": [0, 1]},
            },
        },
    ),
    (
        "Describe an event with a date.",
        {
            "type": "object",
            "properties": {
                "event": NAME,
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "tags": {"type": "array", "items": {"enum": ["fun", "work"]}, "maxItems": 2},
            },
            "required": ["event", "date"],
        },
    ),
]
