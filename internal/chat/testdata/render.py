"""Renders every *.jinja template here with every case of cases.json the
way Hugging Face transformers' apply_chat_template does (Jinja2, an
immutable sandbox with trim_blocks and lstrip_blocks, loop controls, its
tojson, raise_exception and strftime_now), and writes TEMPLATE.CASE.txt:
the expected renderings the Go tests compare against. A rendering that
raises is written as "ERROR: message". Run: python3 render.py (Jinja2 3.1).
"""
import glob, json, os
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime(2026, 1, 2, 15, 4, 5)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: NOW.strftime(f)

here = os.path.dirname(os.path.abspath(__file__))
spec = json.load(open(os.path.join(here, "cases.json")))
for path in sorted(glob.glob(os.path.join(here, "*.jinja"))):
    tmpl = env.from_string(open(path).read())
    name = os.path.basename(path)[:-len(".jinja")]
    for case, c in spec["cases"].items():
        msgs = json.loads(json.dumps(c["messages"]))
        for m in msgs:
            for tc in m.get("tool_calls", []):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        kw = dict(messages=msgs, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
        if c.get("tools"):
            kw["tools"] = spec["tools"]
        try:
            out = tmpl.render(**kw)
        except jinja2.exceptions.TemplateError as e:
            out = "ERROR: " + str(e)
        with open(os.path.join(here, f"{name}.{case}.txt"), "w") as f:
            f.write(out)
