"""Independent reference renderer for chat_template_test: Python jinja2 set up the way Hugging
Face transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, a tojson filter that is
json.dumps(ensure_ascii=False), and the raise_exception / strftime_now globals).

Usage: render_ref.py INPUT.json OUTPUT
  INPUT.json: {"template": "<jinja source>", "context": {<template variables>}}
  OUTPUT:     receives the rendered text, UTF-8, byte for byte.
On a template error: prints "TemplateError: <message>" to stderr and exits with status 3.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        text = env.from_string(request["template"]).render(**request["context"])
    except jinja2.exceptions.TemplateError as e:
        line = getattr(e, "lineno", None)
        print(f"TemplateError: {e}" + (f" (line {line})" if line else ""), file=sys.stderr)
        sys.exit(3)
    with open(sys.argv[2], "w", encoding="utf-8", newline="") as f:
        f.write(text)


if __name__ == "__main__":
    main()
