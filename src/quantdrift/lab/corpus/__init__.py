"""The traffic corpus: thousands of distinct generated prompts that look like a day of a
platform's traffic, and their pairs recorded on real engines.

* :mod:`.worlds` builds seeded worlds (a shop's catalogue, coupons and orders, people,
  documents, code, numbers) in four languages;
* :mod:`.families` turns a world into one prompt of a task family, with its tags and a
  checkable answer where one exists;
* :mod:`.build` draws the whole corpus for a seed and tags each prompt's length with the
  model's real tokenizer;
* :mod:`.record` records every prompt on real vLLM engines, resumably.

Lab code: the guard never imports it. What the evaluation needs travels on the pairs
(``PairEvent.tags``, ``request.task``, the contract), so it reads recorded pairs only.
"""
