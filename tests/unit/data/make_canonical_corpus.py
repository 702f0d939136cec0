"""Writes ``canonical_corpus.jsonl``: varied raw URLs and what ``canonicalize`` made of them
(the canonical form, or the error class) on the code of the day it was run.

Run once, before a canonicalisation change, with the *old* code on ``PYTHONPATH``; the test
(``tests/unit/test_host_spellings.py``) then pins that no URL canonical then changes its
dedupe key or target now. Kept for the next such change:
``PYTHONPATH=<old checkout> python tests/unit/data/make_canonical_corpus.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from core.errors import CrawlfleetError
from core.urls import canonicalize, target_of

HOSTS = ["example.com", "Example.COM", "a.b.example.org", "xn--bcher-kva.example",
         "bücher.example", "127.0.0.2", "10.0.0.1", "8.8.8.8", "[::1]", "[2001:db8::1]",
         "[0:0:0:0:0:0:0:1]", "sub-domain.example.co.uk", "a1.example", "x.github.io",
         "host_with_underscore.example", "example.com.", "localhost", "EXAMPLE.com:80",
         "example.com:8080", "example.com:443", "1.2.3.4:8443", "münchen.de", "a--b.example"]
PATHS = ["", "/", "/a", "/a/b/", "/a/./b/../c", "/%7Euser", "/~user", "/a b", "/ä/ö",
         "/a%2Fb", "/A/B", "/index.html", "/a;p=1", "//double", "/%41%42", "/x%zz"]
QUERIES = ["", "?", "?a=1", "?b=2&a=1", "?a=1&a=2", "?q=a+b", "?q=a%20b", "?utm=1&x=",
           "?k=[v]", "?é=ü"]
FRAGS = ["", "#", "#top", "#a?b"]


def corpus(n: int = 3000, seed: int = 17) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        scheme = rnd.choice(["http", "https", "HTTP", "https"])
        out.append(f"{scheme}://{rnd.choice(HOSTS)}{rnd.choice(PATHS)}{rnd.choice(QUERIES)}"
                   f"{rnd.choice(FRAGS)}")
    return out


def main() -> None:
    path = Path(__file__).with_name("canonical_corpus.jsonl")
    with path.open("w") as fh:
        for raw in corpus():
            try:
                canon = canonicalize(raw)
                row = {"raw": raw, "canonical": canon, "target": target_of(canon),
                       "domain": target_of(canon, "domain")}
            except CrawlfleetError as exc:
                row = {"raw": raw, "error": type(exc).__name__}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
