"""The experiment runner: registry (`registry`), `--set` overrides (`overrides`), run directories (`rundirs`),
summaries and the report (`report`), the papers' claims and their verdicts (`claims`), which code made a run
(`provenance`), which items each split holds (`splits`), judging a finished run again (`judge`), and plots (`plots`).

`experiments.registry` is this package's `registry` module under its historical name.
"""
