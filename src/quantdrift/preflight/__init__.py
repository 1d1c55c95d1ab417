"""The launch checklist (``quantdrift preflight``): checks, report, sign-off.

* ``report``: the report object and the pure go / no-go rule (a skip is never a pass)
* ``config``: the YAML (endpoints, files, thresholds)
* ``leakage``, ``weights``, ``niah``, ``perplexity``: the pure parts of the checks
* ``checks_files``, ``checks_model``, ``checks_gateway``, ``drill``, ``load``: the checks
* ``runner``: runs them in launch order; ``html``: the HTML page; ``signoff``: sign, verify
"""
