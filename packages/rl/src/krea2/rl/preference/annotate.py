"""``krea2 rl annotate``: a small local web page that shows a prompt and its pair's two
images and records a person's choice into the pairs table (keyboard: ← left, → right,
s skip, u undo; progress "n of N").

The side each image is shown on is fixed per pair (:func:`left_role`, from the pair id), so
a person cannot learn "the winner is always left". Choices go straight to the table
(``set_choice``); undo clears the most recent choice of this session. Loopback by default.
"""

from __future__ import annotations

import hashlib
import mimetypes
from pathlib import Path
from typing import TYPE_CHECKING, Any

from krea2.rl.preference.shards import Pair, local_path
from krea2.rl.preference.table import PAIRS_TABLE, read_pairs, set_choice

if TYPE_CHECKING:
    from fastapi import FastAPI

    from krea2.krablet import Warehouse

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>krea2 rl annotate</title>
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
    {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)});
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
    the choices made, and the undo stack."""

    def __init__(self, wh: Warehouse, table: str = PAIRS_TABLE, annotator: str | None = None):
        self.wh, self.table, self.annotator = wh, table, annotator
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
        pair = self.by_id.get(pair_id)
        if pair is None or role not in ("winner", "loser"):
            return None
        return local_path(pair.winner_uri if role == "winner" else pair.loser_uri)


def annotate_app(session: AnnotationSession) -> FastAPI:
    """The page (``/``), its JSON API (``/api/state``, ``/api/choose``, ``/api/undo``) and
    the pairs' images (``/image/{pair_id}/{winner|loser}``: only files named by the table)."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import FileResponse, HTMLResponse

    from krea2.infra.errors import UserError

    app = FastAPI(title="krea2 rl annotate")

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return PAGE

    @app.get("/api/state")
    def state() -> dict:
        return session.state()

    @app.post("/api/choose")
    def choose(body: dict) -> dict:
        try:
            session.choose(str(body.get("pair_id")), str(body.get("side")))
        except UserError as exc:
            raise HTTPException(422, str(exc)) from None
        return session.state()

    @app.post("/api/undo")
    def undo() -> dict:
        session.undo()
        return session.state()

    @app.get("/image/{pair_id}/{role}")
    def image(pair_id: str, role: str) -> FileResponse:
        path = session.image(pair_id, role)
        if path is None or not path.is_file():
            raise HTTPException(404, f"pair {pair_id!r} has no readable {role} image")
        return FileResponse(path, media_type=mimetypes.guess_type(path.name)[0] or "image/png")

    return app
