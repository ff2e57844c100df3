"""The dashboard: ``/`` lists runs, ``/runs/{run_id}`` draws live charts; plotly is served locally."""

from __future__ import annotations

import functools
import html
import json
import time
from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, HTMLResponse

from adwin.controller.core import Controller
from adwin.controller.routers._deps import controller

router = APIRouter(tags=["dashboard"], include_in_schema=False)

_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@functools.lru_cache(maxsize=1)
def plotly_js_path() -> Path:
    """plotly.min.js from the installed ``plotly`` package: the dashboard works offline (no CDN)."""
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js not found at {path}; reinstall the plotly package")
    return path


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(plotly_js_path(), media_type="application/javascript", headers={"Cache-Control": "max-age=86400"})


@router.get("/", response_class=HTMLResponse)
def index(ctrl: Controller = Depends(controller)) -> HTMLResponse:
    rows = []
    windows = {s["run_id"]: s["window"] for s in ctrl.snapshot()}
    for run in ctrl.list_runs():
        rid = html.escape(run.run_id)
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.created_at))
        window = windows.get(run.run_id, "?")
        rows.append(
            f'<tr><td><a href="/runs/{rid}">{rid}</a></td><td>{html.escape(run.name)}</td>'
            f"<td>{html.escape(str(run.policy_state.get('name')))}</td><td>{window}</td><td>{created} UTC</td></tr>"
        )
    body = "\n".join(rows) or '<tr><td colspan="5">no runs yet</td></tr>'
    page = (_TEMPLATES / "index.html").read_text().replace("{{ROWS}}", body)
    return HTMLResponse(page)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: str, ctrl: Controller = Depends(controller)) -> HTMLResponse:
    run = ctrl.get_run(run_id)  # 404 for an unknown run
    page = (_TEMPLATES / "run.html").read_text()
    page = page.replace("{{RUN_ID_JSON}}", json.dumps(run.run_id)).replace("{{RUN_ID}}", html.escape(run.run_id))
    return HTMLResponse(page)
