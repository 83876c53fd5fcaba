"""Tiny SkillSpan-style CoNLL files, written by hand for the converter's tests (not taken from the dataset).

Columns: token, skill tag, knowledge tag. What each sentence exercises is noted above it; the expected
records and gold spans are spelled out in tests/bench/test_skillspan.py.
"""

from __future__ import annotations

# 0: no spans, a placeholder among words (kept), then two blank lines
# 1: two skills, a knowledge span nested in the first one
# 2: only placeholders and punctuation (skipped)
# 3: two tokens, one knowledge span (skipped)
# 4: one knowledge term twice (kept once in gold)
# 5: B after B, B after I, a token with stray spaces around it
# 6: a span at the very end of the file, which has no final newline
SENTENCES_CONLL = """\
We\tO\tO
offer\tO\tO
a\tO\tO
friendly\tO\tO
team\tO\tO
in\tO\tO
<LOCATION>\tO\tO
.\tO\tO


You\tO\tO
will\tO\tO
design\tB-Skill\tO
data\tI-Skill\tB-Knowledge
pipelines\tI-Skill\tI-Knowledge
and\tO\tO
work\tB-Skill\tO
in\tI-Skill\tO
a\tI-Skill\tO
team\tI-Skill\tO
.\tO\tO

<ORGANIZATION>\tO\tO
<ADDRESS>\tO\tO
<CONTACT>\tO\tO
.\tO\tO

Python\tO\tB-Knowledge
.\tO\tO

Knowledge\tO\tO
of\tO\tO
Python\tO\tB-Knowledge
,\tO\tO
SQL\tO\tB-Knowledge
and\tO\tO
Python\tO\tB-Knowledge
.\tO\tO

  Motivated \tB-Skill\tO
hardworking\tB-Skill\tO
people\tO\tO
who\tO\tO
manage\tB-Skill\tO
budgets\tI-Skill\tO
communicate\tB-Skill\tO
clearly\tI-Skill\tO
.\tO\tO

Experience\tO\tO
with\tO\tO
Linux\tO\tB-Knowledge"""

# Two postings separated by ``###`` lines: the first has two sentences with the same skill (kept once in
# its gold), the second one sentence and then one too short to keep on its own (a posting is judged as
# a whole).
POSTINGS_CONLL = """\
### posting one
You\tO\tO
will\tO\tO
write\tB-Skill\tO
reports\tI-Skill\tO

Excel\tO\tB-Knowledge
is\tO\tO
used\tO\tO
to\tO\tO
write\tB-Skill\tO
reports\tI-Skill\tO
### posting two
We\tO\tO
use\tO\tO
Excel\tO\tB-Knowledge

Welcome\tO\tO
"""
