"""The launch checklist (``quantdrift preflight``): checks, report, sign-off.

* ``report``: the report object and the pure go / no-go rule (a skip is never a pass)
* ``config``: the YAML (endpoints, files, thresholds)
* ``leakage``, ``weights``, ``niah``, ``perplexity``: the pure parts of the checks
* ``checks_files``, ``checks_model``, ``checks_gateway``, ``drill``, ``load``: the checks
* ``runner``: runs them in launch order; ``identity``: the engines and weight hashes launched
* ``standard``: the launch standard's ten items, order and words; ``wording``: values in words
* ``html``: the launch page; ``plots``: its inline SVG charts; ``page``: draws it from disk
* ``signoff``: sign, verify, and the page's sign-off block
"""
