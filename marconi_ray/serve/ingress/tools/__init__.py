"""Tool calling and structured outputs at the API: the request fields (`fields`), the
output parsers per tool-call format (`parser`, `hermes`, `qwen3_coder`, `json_list`, by
name from `registry`), their streaming (`stream`), and the grammars that constrain the
output (`grammar`)."""
