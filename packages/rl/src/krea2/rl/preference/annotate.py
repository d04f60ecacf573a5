"""``krea2 rl annotate``: a small local web page that shows a prompt and its pair's two
images and records a person's choice into the pairs table (keyboard: ← left, → right,
s skip, u undo; progress "n of N").

The side each image is shown on is fixed per pair (:func:`left_role`, from the pair id), so
a person cannot learn "the winner is always left". Choices go straight to the table
(``set_choice``); undo clears the most recent choice of this session.

A page a browser opens is reachable by every other site that browser visits, so: loopback
by default and a token off it (:func:`krea2.rl.check_bind`, as the reward server); the Host
header must name the bound address (a DNS-rebinding page cannot read or post); a POST needs
JSON and the per-session key the page embeds (a cross-site form cannot send either); and an
image is served only from the images folder (symlinks resolved) and only if it is a PNG,
JPEG or WebP file, whatever a pairs row names.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import Request  # at module level: FastAPI resolves endpoint annotations here

from krea2.rl.preference.shards import Pair, local_path
from krea2.rl.preference.table import PAIRS_TABLE, read_pairs, set_choice
from krea2.rl.serving import (
    BadJson,
    BodyTooLarge,
    check_bind,
    image_type,
    is_loopback,
    load_json,
    read_body,
    token_matches,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from krea2.krablet import Warehouse

TOKEN_ENV = "KREA2_ANNOTATE_TOKEN"
SESSION_HEADER = "x-krea2-session"
MAX_POST_BYTES = 16 * 2**10  # {"pair_id", "side"}: a few dozen bytes
MAX_IMAGE_BYTES = 64 * 2**20

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>krea2 rl annotate</title>
<meta name="krea2-session" content="{{SESSION}}">
<style>
body{font-family:sans-serif;background:#111;color:#eee;text-align:center;margin:24px}
#prompt{font-size:20px;margin:12px}#progress{color:#aaa}
.img{display:inline-block;margin:12px;cursor:pointer;border:3px solid #333}
.img:hover{border-color:#8cf}.img img{width:320px;height:320px;image-rendering:pixelated}
button{margin:6px;padding:6px 14px}
</style></head><body>
<div id="progress"></div><div id="prompt"></div>
<div><span class="img" id="left"><img alt="left"></span>
<span class="img" id="right"><img alt="right"></span></div>
<div><button id="b-left">← left is better</button><button id="b-skip">s skip</button>
<button id="b-right">right is better →</button><button id="b-undo">u undo</button></div>
<script>
let state = null;
const SESSION = document.querySelector('meta[name="krea2-session"]').content;
function show(s) {
  state = s;
  document.getElementById("progress").textContent =
    s.pair ? `${s.position} of ${s.total}` : `all ${s.total} done`;
  document.getElementById("prompt").textContent = s.pair ? s.pair.prompt : "";
  for (const side of ["left", "right"]) {
    const img = document.querySelector(`#${side} img`);
    img.src = s.pair ? `/image/${s.pair.pair_id}/${s.pair[side]}` : "";
    img.style.visibility = s.pair ? "visible" : "hidden";
  }
  document.body.dataset.pair = s.pair ? s.pair.pair_id : "";
}
async function call(path, body) {
  const r = await fetch(path, body === undefined ? {} :
    {method: "POST", body: JSON.stringify(body),
     headers: {"content-type": "application/json", "x-krea2-session": SESSION}});
  show(await r.json());
}
function choose(side) {
  if (state && state.pair) call("/api/choose", {pair_id: state.pair.pair_id, side});
}
document.getElementById("left").onclick = () => choose("left");
document.getElementById("right").onclick = () => choose("right");
document.getElementById("b-left").onclick = () => choose("left");
document.getElementById("b-right").onclick = () => choose("right");
document.getElementById("b-skip").onclick = () => choose("skip");
document.getElementById("b-undo").onclick = () => call("/api/undo", {});
document.addEventListener("keydown", (e) => {
  if (e.key === "ArrowLeft") choose("left");
  else if (e.key === "ArrowRight") choose("right");
  else if (e.key === "s") choose("skip");
  else if (e.key === "u") call("/api/undo", {});
});
call("/api/state");
</script></body></html>
"""


def left_role(pair_id: str) -> str:
    """Which image of the pair the page shows on the left: ``winner`` or ``loser``, fixed by
    the pair id (half the pairs each way)."""
    return "winner" if hashlib.sha1(pair_id.encode()).digest()[0] % 2 == 0 else "loser"


class AnnotationSession:
    """The pairs to annotate (those without a choice when the page opened, in table order),
    the choices made, and the undo stack. ``images``: the folder the page may serve image
    files from (a row naming a file elsewhere shows no image)."""

    def __init__(
        self,
        wh: Warehouse,
        table: str = PAIRS_TABLE,
        annotator: str | None = None,
        *,
        images: Path,
    ) -> None:
        self.wh, self.table, self.annotator = wh, table, annotator
        self.images = Path(images).resolve()
        self.pairs: list[Pair] = read_pairs(wh, table, annotated=False)
        self.by_id = {p.pair_id: p for p in self.pairs}
        self.choices: dict[str, str] = {}
        self.undo_stack: list[str] = []

    def state(self) -> dict[str, Any]:
        todo = next((p for p in self.pairs if p.pair_id not in self.choices), None)
        out: dict[str, Any] = {"total": len(self.pairs), "done": len(self.choices)}
        out["position"] = len(self.choices) + 1 if todo else len(self.pairs)
        if todo is not None:
            left = left_role(todo.pair_id)
            right = "loser" if left == "winner" else "winner"
            out["pair"] = {"pair_id": todo.pair_id, "prompt": todo.prompt, "left": left,
                           "right": right}  # fmt: skip
        else:
            out["pair"] = None
        return out

    def choose(self, pair_id: str, side: str) -> None:
        from krea2.infra.errors import UserError

        if pair_id not in self.by_id:
            raise UserError(f"no pair {pair_id!r} in this session")
        if side not in ("left", "right", "skip"):
            raise UserError(f"side {side!r} is not left, right or skip")
        left = left_role(pair_id)
        choice = {"skip": "skip", "left": left}.get(side)
        if choice is None:  # right
            choice = "loser" if left == "winner" else "winner"
        set_choice(self.wh, pair_id, choice, self.annotator, self.table)
        self.choices[pair_id] = choice
        self.undo_stack.append(pair_id)

    def undo(self) -> None:
        if not self.undo_stack:
            return
        pair_id = self.undo_stack.pop()
        set_choice(self.wh, pair_id, None, name=self.table)
        del self.choices[pair_id]

    def image(self, pair_id: str, role: str) -> Path | None:
        """The file of a pair's ``winner`` or ``loser`` image, resolved (symlinks followed),
        when it is a file inside :attr:`images`; else None."""
        pair = self.by_id.get(pair_id)
        if pair is None or role not in ("winner", "loser"):
            return None
        try:
            path = local_path(pair.winner_uri if role == "winner" else pair.loser_uri)
            path = path.resolve(strict=True)
        except (OSError, RuntimeError):  # missing, or a symlink loop
            return None
        return path if path.is_relative_to(self.images) and path.is_file() else None

    def unservable(self) -> list[str]:
        """Ids of the pairs an image of which the page will not serve (outside the folder
        or missing)."""
        roles = ("winner", "loser")
        return [
            p.pair_id for p in self.pairs if any(self.image(p.pair_id, r) is None for r in roles)
        ]


def _host_names(host: str, extra: Sequence[str]) -> set[str] | None:
    """The names a Host header may carry for a server bound to ``host`` (None: any, for a
    wildcard bind, where the token is what guards the page)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {host.lower().strip("[]"), *(name.lower() for name in extra)}
    if is_loopback(host):
        names |= {"127.0.0.1", "localhost", "::1"}
    return names


def _host_ok(header: str | None, names: set[str] | None, port: int | None) -> bool:
    if header is None:
        return False
    try:
        parts = urlsplit(f"//{header}")
        given_port = parts.port
    except ValueError:
        return False
    if names is not None and (parts.hostname or "") not in names:
        return False
    return not port or given_port == port


def annotate_app(
    session: AnnotationSession,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    token: str | None = None,
    allowed_hosts: Sequence[str] = (),
) -> FastAPI:
    """The page (``/``), its JSON API (``/api/state``, ``/api/choose``, ``/api/undo``) and
    the pairs' images (``/image/{pair_id}/{winner|loser}``: only image files under the
    session's folder), for a server bound to ``host``:``port`` (``port`` None or 0: any).

    ``token`` (required off loopback) is accepted as ``Authorization: Bearer``, or once as
    ``/?token=…``, which sets a same-site cookie and redirects to ``/``. ``allowed_hosts``:
    more names the Host header may carry (a DNS name of the machine).
    """
    from fastapi import FastAPI, HTTPException
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

    from krea2.infra.errors import UserError

    check_bind(host, token, "the annotation page", TOKEN_ENV)
    names = _host_names(host, allowed_hosts)
    session_key = secrets.token_urlsafe(32)  # proves a POST came from the page we served
    # The cookie holds a digest of the token, not the token; its name differs per token, so
    # two pages on one machine (cookies ignore ports) do not overwrite each other's.
    proof = hashlib.sha256(f"krea2-annotate:{token}".encode()).hexdigest()
    cookie = f"krea2_annotate_{proof[:12]}"
    page_html = PAGE.replace("{{SESSION}}", session_key)
    app = FastAPI(title="krea2 rl annotate", docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(status: int, detail: str) -> JSONResponse:
        return JSONResponse({"detail": detail}, status_code=status)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = request.cookies.get(cookie, "")
        by_cookie = hmac.compare_digest(given.encode(), proof.encode())
        return by_cookie or token_matches(request.headers.get("authorization"), token)

    @app.middleware("http")
    async def guard(request: Request, call_next):  # type: ignore[no-untyped-def]
        if not _host_ok(request.headers.get("host"), names, port):
            return refuse(400, f"Host {request.headers.get('host')!r} is not this page's address")
        if token is not None and request.url.path == "/" and "token" in request.query_params:
            if not hmac.compare_digest(request.query_params["token"].encode(), token.encode()):
                return refuse(401, "wrong token")
            response = RedirectResponse("/", status_code=303)  # the token leaves the URL bar
            response.set_cookie(cookie, proof, httponly=True, samesite="strict")
            return response
        if not authorized(request):
            return refuse(401, f"open /?token=<the --token or {TOKEN_ENV}>, or send a bearer token")
        if request.method not in ("GET", "HEAD"):
            if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return refuse(403, "cross-site requests are refused")
            content_type = request.headers.get("content-type", "").split(";")[0].strip()
            if content_type != "application/json":
                return refuse(415, "send JSON (Content-Type: application/json)")
            given = request.headers.get(SESSION_HEADER, "")
            if not hmac.compare_digest(given.encode(), session_key.encode()):
                return refuse(403, f"missing or wrong {SESSION_HEADER}: reload the page")
        return await call_next(request)

    async def json_body(request: Request) -> dict:
        try:
            body = load_json(await read_body(request, MAX_POST_BYTES) or b"{}")
        except BodyTooLarge as exc:
            raise HTTPException(413, str(exc), {"connection": "close"}) from None
        except BadJson as exc:
            raise HTTPException(400, str(exc)) from None
        if not isinstance(body, dict):
            raise HTTPException(422, "the body must be a JSON object")
        return body

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return page_html

    @app.get("/api/state")
    def state() -> dict:
        return session.state()

    @app.post("/api/choose")
    async def choose(request: Request) -> dict:
        body = await json_body(request)
        try:  # the table write blocks: off the event loop
            await run_in_threadpool(session.choose, str(body.get("pair_id")), str(body.get("side")))
        except UserError as exc:
            raise HTTPException(422, str(exc)) from None
        return session.state()

    @app.post("/api/undo")
    async def undo(request: Request) -> dict:
        await json_body(request)
        await run_in_threadpool(session.undo)
        return session.state()

    @app.get("/image/{pair_id}/{role}")
    def image(pair_id: str, role: str) -> Response:
        path = session.image(pair_id, role)
        data = path.read_bytes() if path and path.stat().st_size <= MAX_IMAGE_BYTES else b""
        media_type = image_type(data)  # from the bytes served, not the file's name
        if media_type is None:
            raise HTTPException(404, f"pair {pair_id!r} has no {role} image this page serves")
        return Response(data, media_type=media_type)

    return app
