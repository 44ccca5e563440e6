"""The entrypoint of an interactive session: JupyterLab or TensorBoard on a unix socket.

The control plane writes a session's entrypoint as ``python -m trainhub.runtime.session_server``;
the rank runs it in the trial's sandbox like any entrypoint. The server listens on a unix socket
in the attempt's spool folder (``$TRAINHUB_SPOOL_DIR/session.sock``, mode 0600): no TCP port
anywhere, so nothing but the control plane's proxy, which reads that folder on the node,
reaches it; and it requires the per-session secret the proxy adds to every request it
forwards (docs/sessions.md, ADR 0035).

Run by hand (outside trainhub) it needs the same variables::

    TRAINHUB_SESSION_KIND=notebook TRAINHUB_SESSION_SECRET=s TRAINHUB_SPOOL_DIR=/tmp/x \\
        python -m trainhub.runtime.session_server
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from trainhub.runtime import protocol

_LOGDIR = "tensorboard"  # event files of the trials a tensorboard session shows (in its code)


def _jupyter_argv(socket: str, base_url: str, root: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.sock={socket}",
        "--ServerApp.sock_mode=0600",
        f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root}",
        # the Host and Origin are the control plane's: the proxy is the only way in
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.terminals_enabled=True",
        "--ServerApp.shutdown_no_activity_timeout=0",  # the control plane culls (idle rule)
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.log_level=WARN",
        "--ServerApp.allow_root=True",  # uid 0 of its own user namespace, or a root node agent
        "--LabApp.extension_manager=readonly",  # nothing installed from inside, no index asked
    ]


def main() -> None:
    kind = os.environ.get(protocol.ENV_SESSION_KIND, "notebook")
    secret = os.environ.pop(protocol.ENV_SESSION_SECRET, "")
    spool = os.environ.get(protocol.ENV_SPOOL_DIR, "")
    if not secret or not spool:
        sys.exit(
            f"session_server: {protocol.ENV_SESSION_SECRET} and {protocol.ENV_SPOOL_DIR} must "
            "be set (the control plane starts sessions; see docs/sessions.md)"
        )
    socket = str(Path(spool) / protocol.SESSION_SOCKET_NAME)
    base_url = os.environ.get(protocol.ENV_SESSION_BASE_URL, "/")
    home = os.environ.get("HOME") or os.getcwd()
    if kind == "tensorboard":
        serve_tensorboard(socket, base_url, str(Path.cwd() / _LOGDIR), secret)
        return
    os.environ["JUPYTER_TOKEN"] = secret  # jupyter-server's token: read from here, never argv
    # the server's state (runtime files, kernels' connection files) in the spool, not the home
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", str(Path(spool) / "jupyter-runtime"))
    os.environ.setdefault("SHELL", "/bin/bash")
    argv = _jupyter_argv(socket, base_url, home)
    print(f"[trainhub] session {kind}: serving {base_url} on {socket}", flush=True)
    os.execv(argv[0], argv)


def serve_tensorboard(socket: str, base_url: str, logdir: str, secret: str) -> None:
    """TensorBoard's WSGI app on a unix socket, behind a check of the session's secret."""
    from tensorboard import program
    from werkzeug.serving import make_server

    expected = f"token {secret}"

    class _UnixServer(program.TensorBoardServer):  # type: ignore[misc]
        def __init__(self, wsgi_app: Any, flags: Any) -> None:
            def guarded(environ: dict[str, Any], start_response: Any) -> Any:
                if environ.get("HTTP_AUTHORIZATION") != expected:
                    start_response("403 Forbidden", [("Content-Type", "text/plain")])
                    return [b"forbidden\n"]
                return wsgi_app(environ, start_response)

            self._server = make_server(f"unix://{socket}", 0, guarded, threaded=True)
            os.chmod(socket, 0o600)

        def serve_forever(self) -> None:
            self._server.serve_forever()

        def get_url(self) -> str:
            # TensorBoard records a port in its info file: 0 says "none" (a unix socket)
            return f"http://localhost:0{base_url}"

    board = program.TensorBoard(server_class=_UnixServer)
    board.configure(logdir=logdir, path_prefix=base_url.rstrip("/"), load_fast="false")
    print(f"[trainhub] session tensorboard: serving {base_url} on {socket}", flush=True)
    board.main()


if __name__ == "__main__":
    main()
