"""The lab's web server: a Starlette app over one loaded model, served by uvicorn.

The page (static/index.html, lab.js, lab.css) and plotly's JavaScript bundle, taken from the
installed plotly package, are read once at start-up and served from memory under fixed names, so
no request names a file and the page needs no internet access. Every view is fed by a JSON
endpoint under /api/ that calls the same `andrea.inside.embed` functions the `andrea embed` commands print:

    GET  /api/info         the model, its config, the presets, the limits below
    GET  /api/lesson       the embedding lesson's steps on this model (andrea.inside.lessons.embedding)
    GET  /api/lesson/attention   the attention lesson's steps (andrea.inside.lessons.attention)
    GET  /api/lesson/block       the block lesson's steps (andrea.inside.lessons.block)
    POST /api/params       {"preset": null | NAME}                      where the parameters live
    POST /api/token        {"word", "bare", "whole_words", "metric", "k"} lookup, norms, neighbours,
                           and where the run's data is known the word's purity and coverage there
    POST /api/compare      {"a", "b", "bare"}                            dot, norms, cos, angle, plane
    POST /api/map          {"words" | "top", "method", "table", "bare"}  2-D map
    GET  /api/positions                                                  position similarity
    POST /api/attention    {"prompt", "bos"}                             every layer × head pattern
    POST /api/lens         {"prompt", "k", "bos"}                        the logit lens
    POST /api/layers       {"uses", "ppmi"}   word vectors from the blocks, scored per block beside
                           the tables (andrea.inside.context_vectors.score_layers; the run's data and the word sets)
    POST /api/generate     {"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed"}
                           a stream of JSON lines, one per token, then {"done": ...}
    /api/growth...         the Growth view: the run's embedding snapshots (see `andrea.web.lab_growth`)

Bad input (a body that is not a JSON object, an unknown field, a value of the wrong type or out of
range, an oversized prompt, a word the library refuses) gets status 400 and {"error": sentence};
an unknown path 404, a wrong method 405, an oversized body 413, all as JSON. A failure in the
server itself gets 500 with one line on stderr, never a traceback. A POST must declare its body as
JSON, and on a loopback address only requests whose Host header names this machine are answered
(both as for `andrea serve`: the plumbing is `andrea.web.http`'s).
"""

from __future__ import annotations

import json
import math
import threading
from importlib import resources
from pathlib import Path

import numpy as np

from andrea.config import PRESETS
from andrea.decoding.generate import generate_steps
from andrea.errors import AndreaError, longer_than_context
from andrea.inside import blocks, context_vectors, embed
from andrea.inside.lessons import attention as attention_lesson
from andrea.inside.lessons import block as block_lesson
from andrea.inside.lessons.embedding import inputs_for
from andrea.inside.lessons.embedding import lesson as lesson_steps
from andrea.inside.lessons.embedding import to_json as lesson_json
from andrea.inside.vectors import METRICS, whole_word_mask
from andrea.inside.wordsim import LESSON_PAIRS, LESSON_RELATED, try_load_wordsets
from andrea.tokenizer.harris import LETTER_WORD
from andrea.tokenizer.words import data_word_counts, word_tokens
from andrea.usage import run_data, run_usage
from andrea.web import lab_growth
from andrea.web.common import MAX_K, MAX_WORD_CHARS, finite, rounded
from andrea.web.http import Fields, Guard, RequestError, UvicornServer, bind, logger, loopback_hosts, read_body
from andrea.web.lab_growth import HOW_TO_FETCH, GrowthViews

MAX_BODY = 16_384  # bytes of a request body
MAX_PROMPT_CHARS = 2_000
MAX_WORDS = 200  # words on one map
MAX_TOP = 2_000  # most used segments on one map (t-SNE: MAX_TSNE)
MAX_TSNE = 500
MAX_ATTENTION_TOKENS = 64  # every layer × head × T² weights go to the page
MAX_LENS_TOKENS = 128
MAX_NEW_TOKENS = 500
MAX_HEATMAP = 256  # position rows drawn; longer tables are sampled evenly
MAX_USES = 64  # uses of a word averaged in the Layers view


# ---------------------------------------------------------------- the views, as plain functions of a subject


LESSONS = threading.Lock()  # the walks that remove parts of the model run one at a time


class LabViews:
    """What each endpoint computes, given the parsed body: plain dicts, ready for JSON."""

    def __init__(self, subject: embed.Subject):
        self.subject = subject
        self.model, self.tok = subject.model, subject.tokenizer
        self.cfg = subject.model.config
        self._layers: dict[tuple, dict] = {}
        self.sets = try_load_wordsets(log=_log)  # read once, as the Growth view does

    def info(self, f: Fields) -> dict:
        cfg = self.cfg
        whole = whole_word_mask(self.tok, cfg.vocab_size)
        # the most used whole words (segments are numbered most used first), for the word box's list
        suggestions = [self.tok.id_to_piece(int(i))[1:] for i in np.flatnonzero(whole)[:400]]
        return {"model": self.subject.name, "config": cfg.to_dict(), "params": self.model.num_params(),
                "tokenizer_note": self.subject.tokenizer_note, "presets": list(PRESETS),
                "lesson_pairs": [list(p) for p in LESSON_PAIRS], "lesson_related": len(LESSON_RELATED),
                "suggestions": suggestions,
                "limits": {"prompt_chars": MAX_PROMPT_CHARS, "attention_tokens": MAX_ATTENTION_TOKENS,
                           "lens_tokens": MAX_LENS_TOKENS, "new_tokens": MAX_NEW_TOKENS, "k": MAX_K,
                           "words": MAX_WORDS, "top": MAX_TOP, "tsne": MAX_TSNE}}

    def params(self, f: Fields) -> dict:
        preset = f.body.get("preset")
        if preset is None:
            groups, name = embed.parameter_groups(self.model), self.subject.name
        else:
            preset = f.choice("preset", None, list(PRESETS))
            groups, name = embed.preset_parameter_groups(preset), preset
        return {"name": name, "rows": [{"name": g.name, "shape": g.shape, "count": g.count, "share": g.share, "part": g.part}
                                       for g in groups]}

    def usage(self):
        """How each token is used in the run's training data (andrea.usage), read once: (figures or None, why not)."""
        if not hasattr(self, "_usage"):
            self._usage = run_usage(self.subject.checkpoint, self.tok, log=_log)
        return self._usage

    def words(self):
        """Purity and coverage over the run's training text (andrea.tokenizer.words), counted once where
        its usage is known (the same data, prepared with this tokenizer): (figures or None, why not)."""
        if not hasattr(self, "_words"):
            usage, why = self.usage()
            data, why = run_data(self.subject.checkpoint, self.tok) if usage is not None else (None, why)
            if data is not None:
                _log(f"counting the words of {data.dir}'s training text for purity and coverage")
            self._words = (word_tokens(self.tok, data_word_counts(data, self.tok)), "") if data is not None else (None, why)
        return self._words

    def lesson(self, f: Fields) -> dict:
        """The embedding lesson's steps on this model (andrea.inside.lessons.embedding), computed once; without the PPMI reference,
        which `andrea lesson` adds."""
        if not hasattr(self, "_lesson"):
            inp = inputs_for(self.model, self.tok, self.subject.name, self.subject.checkpoint, ppmi=False, log=_log)
            self._lesson = finite(lesson_json(inp, lesson_steps(inp)))  # a ρ of too few pairs is NaN: null in JSON
        return self._lesson

    def lesson_attention(self, f: Fields) -> dict:
        """The attention lesson's steps on this model (andrea.inside.lessons.attention), computed once (one
        walk at a time: its removals hook the model while they run)."""
        with LESSONS:
            if not hasattr(self, "_lesson_attention"):
                inp = attention_lesson.inputs_for(self.model, self.tok, self.subject.name, self.subject.checkpoint)
                steps = attention_lesson.lesson(inp, log=_log)
                self._lesson_attention = finite(attention_lesson.to_json(inp, steps))
        return self._lesson_attention

    def lesson_block(self, f: Fields) -> dict:
        """The block lesson's steps on this model (andrea.inside.lessons.block), computed once, one walk at a time."""
        with LESSONS:
            if not hasattr(self, "_lesson_block"):
                inp = block_lesson.inputs_for(self.model, self.tok, self.subject.name, self.subject.checkpoint)
                self._lesson_block = finite(block_lesson.to_json(inp, block_lesson.lesson(inp, log=_log)))
        return self._lesson_block

    def token(self, f: Fields) -> dict:
        word = f.text("word", MAX_WORD_CHARS)
        bare, whole = f.flag("bare"), f.flag("whole_words")
        metric = f.choice("metric", "cos", METRICS)
        k = f.integer("k", 10, 1, MAX_K)
        usage, why = self.usage()
        out = {}
        for which in embed.TABLES:
            out[which] = embed.neighbours(self.model, self.tok, word, k, metric, which, bare, whole, usage)
        words = self.words()[0] if LETTER_WORD.fullmatch(word.strip()) else None
        return {"word_tokens": words.word(self.tok, word) if words else None,
                "word_line": words.sentence(self.tok, word) if words else None,"word": out["input"]["word"], "metric": metric, "whole_words": whole,
                "whole_words_rule": out["input"]["whole_words_rule"], "usage": out["input"].get("usage"),
                "usage_line": out["input"].get("usage_line"), "usage_unknown": why or None,
                "norms": {w: out[w]["norm"] for w in embed.TABLES},
                "neighbours": {w: out[w]["neighbours"] for w in embed.TABLES}}

    def compare(self, f: Fields) -> dict:
        a, b = f.text("a", MAX_WORD_CHARS), f.text("b", MAX_WORD_CHARS)
        return finite(embed.compare(self.model, self.tok, a, b, f.flag("bare")))  # a zero row's angle: null, as --json

    def map(self, f: Fields) -> dict:
        method = f.choice("method", "pca", embed.MAP_METHODS)
        which = f.choice("table", "input", embed.TABLES)
        bare = f.flag("bare")
        if f.body.get("words") is not None:
            words = f.words("words", 2, MAX_WORDS, MAX_WORD_CHARS, "a map")
            if "top" in f.body:
                raise RequestError("give either words or top, not both.")
            return embed.map_points(self.model, self.tok, words, None, which, bare, method)
        top = f.integer("top", 200, 2, MAX_TSNE if method == "tsne" else MAX_TOP)
        return embed.map_points(self.model, self.tok, None, top, which, bare, method)

    def positions(self, f: Fields) -> dict:
        r = embed.positions(self.model)
        out = {"scheme": r["scheme"], "note": r["note"], "table": r["table"]}
        if r["table"] is not None:
            sim = r["similarity"]
            step = max(1, math.ceil(len(sim) / MAX_HEATMAP))
            at = np.arange(0, len(sim), step)
            out.update(positions=r["positions"], norm_mean=r["norm_mean"], similarity_at=r["similarity_at"],
                       heatmap_positions=at.tolist(), heatmap=rounded(sim[np.ix_(at, at)], 4),
                       by_distance=rounded(embed.similarity_by_distance(sim), 6))
        return out

    def _prompt(self, f: Fields, limit_tokens: int) -> tuple[str, bool]:
        prompt, bos = f.text("prompt", MAX_PROMPT_CHARS), f.flag("bos", True)
        n = len(self.tok.encode(prompt, bos=bos))
        limit = min(limit_tokens, self.cfg.block_size)
        if n > limit:
            raise RequestError(longer_than_context(n, limit, whose="this view's limit"))
        return prompt, bos

    def attention(self, f: Fields) -> dict:
        prompt, bos = self._prompt(f, MAX_ATTENTION_TOKENS)
        r = blocks.attention(self.model, self.tok, prompt, bos)
        return {"ids": r["ids"], "pieces": r["pieces"], "layers": r["layers"], "heads": r["heads"],
                "patterns": rounded(r["patterns"], 4)}

    def lens(self, f: Fields) -> dict:
        k = f.integer("k", 5, 1, 20)
        prompt, bos = self._prompt(f, MAX_LENS_TOKENS)
        return blocks.logit_lens(self.model, self.tok, prompt, k, bos)

    def layers(self, f: Fields) -> dict:
        """Word vectors from the blocks scored per block beside the tables, once per (uses, ppmi)."""
        uses, ppmi = f.integer("uses", context_vectors.USES, 1, MAX_USES), f.flag("ppmi")
        if (uses, ppmi) not in self._layers:
            data, why = run_data(self.subject.checkpoint, self.tok)
            if data is None:
                raise RequestError(f"word vectors from the blocks are a word's hidden states averaged over its uses in "
                                   f"the run's training text, and that is not known here: {why}.")
            if self.sets is None:
                raise RequestError(HOW_TO_FETCH)
            r = context_vectors.score_layers(self.model, self.tok, data, self.sets, uses, ppmi=ppmi, log=_log)
            self._layers[(uses, ppmi)] = finite(r)  # a ρ of too few pairs is NaN: null in JSON
        return self._layers[(uses, ppmi)]

    def generate(self, f: Fields):
        prompt = f.text("prompt", MAX_PROMPT_CHARS)
        settings = dict(
            max_new_tokens=f.integer("max_new_tokens", 40, 1, MAX_NEW_TOKENS),
            temperature=f.number("temperature", 1.0, 0.0, 10.0),
            top_k=f.integer("top_k", None, 1, self.cfg.vocab_size),
            top_p=f.number("top_p", None, 0.0, 1.0, lo_open=True),
            seed=f.integer("seed", None, 0, 2**63 - 1),
            alternatives=f.integer("alternatives", 5, 1, 20),
        )
        return generate_steps(self.model, self.tok, prompt, **settings)


FIELDS = {
    "info": set(),
    "lesson": set(),
    "lesson_attention": set(),
    "lesson_block": set(),
    "params": {"preset"},
    "token": {"word", "bare", "whole_words", "metric", "k"},
    "compare": {"a", "b", "bare"},
    "map": {"words", "top", "method", "table", "bare"},
    "positions": set(),
    "attention": {"prompt", "bos"},
    "lens": {"prompt", "k", "bos"},
    "layers": {"uses", "ppmi"},
    "generate": {"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "alternatives"},
}


# ---------------------------------------------------------------- the app


def _asset_bytes() -> dict[str, tuple[bytes, str]]:
    """Every file the page loads, by the one name it is served under."""
    static = resources.files("andrea.web") / "static"
    assets = {}
    for name, kind in (("index.html", "text/html; charset=utf-8"), ("lab.js", "text/javascript; charset=utf-8"),
                       ("lab.css", "text/css; charset=utf-8"), ("favicon.svg", "image/svg+xml")):
        assets[name] = ((static / name).read_bytes(), kind)
    import plotly  # a heavy optional dependency: its bundle is read once, at start

    bundle = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    try:
        assets["plotly.min.js"] = (bundle.read_bytes(), "text/javascript; charset=utf-8")
    except OSError:
        raise AndreaError(f"plotly's JavaScript bundle is missing from the installed plotly package ({bundle}); "
                          "reinstall plotly.") from None
    return assets


SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # everything comes from this server; plotly sets inline styles on the elements it draws
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
}


_log = logger("andrea lab")


def _error(message: str, status: int = 400):
    from starlette.responses import JSONResponse  # starlette: needed only to serve

    return JSONResponse({"error": message}, status_code=status, headers=SECURITY_HEADERS)


async def _read_body(request) -> dict:
    """The request's JSON object ({} for a GET), or RequestError saying what is wrong."""
    if request.method == "GET":
        if request.query_params:
            raise RequestError("this endpoint takes no query parameters.")
        return {}
    return await read_body(request, MAX_BODY)


def _lines(name: str, steps):
    """A stream of steps as JSON lines, then {"done": ...}, or the error that ended it."""
    n = 0
    try:
        for step in steps:
            n += 1
            yield json.dumps(step, ensure_ascii=False) + "\n"
        yield json.dumps({"done": True, "tokens": n}) + "\n"
    except AndreaError as e:
        yield json.dumps({"error": str(e)}) + "\n"
    except Exception as e:
        _log(f"{name} failed: {type(e).__name__}: {e}")
        yield json.dumps({"error": f"generation failed ({type(e).__name__}); the server's log says more."}) + "\n"


def _endpoint(name: str, compute, allowed: set[str], stream: bool = False):
    """The endpoint that reads a body's `allowed` fields and answers with compute(fields): JSON,
    or with stream a stream of JSON lines; bad input gets 400 and one sentence."""
    # starlette: needed only to serve
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, StreamingResponse

    async def endpoint(request):
        try:
            fields = Fields(await _read_body(request), allowed)
            result = await run_in_threadpool(compute, fields)
        except RequestError as e:
            return _error(e.message, e.status)
        except AndreaError as e:
            return _error(str(e))
        except Exception as e:  # a fault of the server, not of the request: one line, no traceback
            _log(f"{name} failed: {type(e).__name__}: {e}")
            return _error(f"the lab failed on this request ({type(e).__name__}); the server's log says more.", 500)
        if not stream:
            return JSONResponse(result, headers=SECURITY_HEADERS)
        return StreamingResponse(_lines(name, result), media_type="application/x-ndjson", headers=SECURITY_HEADERS)

    return endpoint


def _page_routes(assets: dict) -> list:
    """The page and the files it loads, each under its one fixed name."""
    # starlette: needed only to serve
    from starlette.responses import Response
    from starlette.routing import Route

    async def page(request):
        body, kind = assets["index.html"]
        return Response(body, media_type=kind, headers=SECURITY_HEADERS)

    async def static(request):
        name = request.path_params["name"]
        if name not in assets or name == "index.html":
            return _error(f"there is no file {name!r} here.", 404)
        body, kind = assets[name]
        return Response(body, media_type=kind, headers={**SECURITY_HEADERS, "Cache-Control": "max-age=3600"})

    return [Route("/", page, methods=["GET"]), Route("/static/{name}", static, methods=["GET"])]


def _api_routes(views: LabViews, growth_views: GrowthViews) -> list:
    """/api/...: the model's views, then the Growth view's."""
    from starlette.routing import Route  # starlette: needed only to serve

    def route(path, name, method, owner, fields, stream=False):
        return Route(path, _endpoint(name, getattr(owner, name), fields[name], stream), methods=[method])

    routes = [route("/api/info", "info", "GET", views, FIELDS), route("/api/positions", "positions", "GET", views, FIELDS),
              route("/api/lesson", "lesson", "GET", views, FIELDS),
              route("/api/lesson/attention", "lesson_attention", "GET", views, FIELDS),
              route("/api/lesson/block", "lesson_block", "GET", views, FIELDS)]
    for name in ("params", "token", "compare", "map", "attention", "lens", "layers"):
        routes.append(route(f"/api/{name}", name, "POST", views, FIELDS))
    routes.append(route("/api/generate", "generate", "POST", views, FIELDS, stream=True))
    routes += [route(path, name, method, growth_views, lab_growth.FIELDS) for path, name, method in lab_growth.ROUTES]
    return routes


def create_app(subject: embed.Subject, allowed_hosts: set[str] | None = None):
    """The ASGI app for one loaded model: Starlette routes inside a `Guard`. allowed_hosts, when
    given, refuses requests whose Host header is not in it (`LabServer` passes the loopback names
    when serving on loopback). The Growth view reads the snapshots of the run the subject's
    checkpoint belongs to, if any; `state.growth` holds it."""
    # starlette: needed only to serve
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    growth_views = GrowthViews(subject)
    routes = _page_routes(_asset_bytes()) + _api_routes(LabViews(subject), growth_views)

    async def http_error(request, exc: HTTPException):
        messages = {404: f"there is nothing at {request.url.path!r}.", 405: f"{request.method} is not allowed here."}
        return _error(messages.get(exc.status_code, str(exc.detail)), exc.status_code)

    async def server_error(request, exc: Exception):  # the Guard writes the log's one line
        return _error("the lab failed on this request; the server's log says more.", 500)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, 500: server_error})
    app.router.redirect_slashes = False  # a path with a slash too many is a 404, not a redirect
    app.state.growth = growth_views
    return Guard(app, allowed_hosts, lambda e: {"error": e.message}, _log, SECURITY_HEADERS)


# ---------------------------------------------------------------- serving


class LabServer(UvicornServer):
    """A uvicorn server for the lab on one socket, run in the foreground (`serve_forever`) or in a
    background thread (`start`, `stop`: the tests and the screenshot script). On a loopback
    address only requests that name this machine are answered (see `andrea.web.http`)."""

    def __init__(self, subject: embed.Subject, host: str = "127.0.0.1", port: int = 8000):
        sock = bind(host, port)
        app = create_app(subject, loopback_hosts(sock.getsockname()[0], host))
        self.growth = app.state.growth
        super().__init__(sock, app, render=lambda e: {"error": e.message}, timeout_graceful_shutdown=2)
