"""A trial that needs a package the platform's environment lacks (inflection, from PyPI).

With WRITE_ENV=1 it also tries to change its environment (it must not be able to).
"""

import os
import sys

import inflection  # not in the base environment: only the trial's environment has it

import trainhub

ctx = trainhub.init()
print("ENV", os.environ.get("VIRTUAL_ENV", "-"), "PYTHON", sys.executable, flush=True)
print("INFLECTION", inflection.__file__, inflection.camelize("env_ok"), flush=True)
if os.environ.get("WRITE_ENV") == "1":
    target = os.path.join(os.path.dirname(inflection.__file__), "__init__.py")
    for path in (target, os.path.join(os.environ["VIRTUAL_ENV"], "planted.txt")):
        try:
            with open(path, "a") as handle:
                handle.write("# changed by a trial\n")
            print("WROTE", path, flush=True)
        except OSError as exc:
            print("REFUSED", path, exc.errno, flush=True)
ctx.report(step=1, loss=0.5)
