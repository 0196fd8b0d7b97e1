"""The adapter kit: what the shipped adapters share, under a public name for
adapters written outside this package (docs/adapters.md, "Adapter kit").

The names are the shipped adapters' own, re-exported from
:mod:`mtpcheck.backends._library` (in-process libraries) and
:mod:`mtpcheck.backends.httpserver` (HTTP servers); import them from here,
which is kept stable. Two kinds of adapter:

* **an in-process library**: subclass :class:`LibraryBackend`; in
  ``__init__`` set ``runtime``, ``tokenizer``, ``vocab_size``, ``context``
  and ``truth = DecodePathLogprobs(forward, make_cache)`` (ground truth
  along the plain decode path); write ``capabilities()`` and ``_run(request)``,
  a generator that calls ``self.check(request)``, :func:`plan_speculation`,
  feeds the library's token stream to :func:`drive_chunks` (the project's
  stop matcher) and returns ``self.result(...)``. ``generate``,
  ``generate_stream``, ``encode``/``decode`` and ``target_distributions``
  come with the base.
* **an HTTP server with a plain twin**: start a plain and a speculative
  server (:class:`ServerProcess`, :class:`Client`), subclass
  :class:`ServerTruth` and give it ``law_request`` (a one-token completion
  with N probabilities on the plain server) and ``law_top`` (read them:
  :func:`completion_top`, :func:`openai_top`, :func:`legacy_top`):
  ``target_distributions`` comes with it. ``generate`` is
  :func:`check_request`, :func:`plan_speculation`, one POST, :func:`drive`
  over the returned token ids, :func:`report` of the rounds and
  :func:`result_of`; ``generate_batch`` is :func:`serve_together`.

Options every adapter offers the same way: ``dtype=`` (:func:`cast`, and
:func:`dtype_name` to declare what a model runs in), ``logit_scale=``
(:func:`with_scale`), the shipped fixtures' folders (:func:`real_fixture_dir`).
"""

from __future__ import annotations

from mtpcheck.backends._library import (
    GUARD_DOC,
    DecodePathLogprobs,
    LibraryBackend,
    cast,
    check_request,
    composed_sampler,
    context_limit,
    drive,
    drive_chunks,
    dtype_name,
    library_sampling,
    library_version,
    penalty_processors,
    plan_speculation,
    real_fixture_dir,
    report,
    require_library,
    resolve_drafter,
    result_of,
    run_to_end,
    switch,
    with_scale,
)
from mtpcheck.backends.httpserver import (
    Client,
    ServerError,
    ServerProcess,
    ServerTruth,
    close_all,
    completion_top,
    kept_rounds,
    legacy_top,
    openai_top,
    plain_path_laws,
    post_logprobs,
    serve_together,
    slots_option,
    token_logprobs,
)

__all__ = [
    "GUARD_DOC", "DecodePathLogprobs", "LibraryBackend", "cast", "check_request", "composed_sampler",
    "context_limit", "drive", "drive_chunks", "dtype_name", "library_sampling", "library_version",
    "penalty_processors", "plan_speculation", "real_fixture_dir", "report", "require_library", "resolve_drafter",
    "result_of", "run_to_end", "switch", "with_scale",
    "Client", "ServerError", "ServerProcess", "ServerTruth", "close_all", "completion_top", "kept_rounds",
    "legacy_top", "openai_top", "plain_path_laws", "post_logprobs", "serve_together", "slots_option",
    "token_logprobs",
]
