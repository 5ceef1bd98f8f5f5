"""The runtime layer every other package stands on, torch-free at import: where the project lives (``paths``),
the artifact cache (``cache``), MLflow tracking (``tracking``), the job clock (``jobclock``), the serving client
(``serving``), strict JSON (``jsonio``), thread pinning (``threads``), command-line conventions (``command``,
``inputs``) and lazy re-exports (``lazy``)."""
