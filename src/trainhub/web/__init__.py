"""The web dashboard: server-rendered pages under /ui, served by the control plane itself.

Pages call the same services as the API, with the principal of the session's token, so a
page shows exactly what the API would; the web layer holds no authorisation rules of its own.
"""
