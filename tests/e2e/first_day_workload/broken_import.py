"""A script whose environment lacks a package: it fails at import, before any report."""

import sklearnx  # noqa: F401  (not installed anywhere)

import trainhub

ctx = trainhub.init()
ctx.report(step=1, loss=1.0)
