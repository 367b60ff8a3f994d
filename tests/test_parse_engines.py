"""The native scanner (PCRE2) and the Python engine give the same parse, to the last field.

Every bundled log, and damaged copies of the representative ones, is parsed in this process
(the engine the install built) and in a child with ``REPRO_PARSE_ENGINE=python``; the two
results must be equal: parser, line count, facts, issues, and every series with every record
(value, iteration, epoch, line). Where the native scanner is not built the comparison would
compare the Python engine with itself: the tests are skipped locally and FAIL in CI
(``REPRO_REQUIRE`` / ``CI``), like every test that needs a real component.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
from parsers_helpers import (
    PUBLISHED,
    crlf,
    cut_inside_line,
    full,
    mpi_tagged,
    parameter_lines,
    reference_logs,
    representative_logs,
    spliced_tags,
    with_junk,
)

from repro.parsers import base as engine
from repro.parsers import parse_file

pytestmark = pytest.mark.native

CHILD = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
from parsers_helpers import full
from repro.parsers import base, parse_file
assert base.ENGINE == "python", base.ENGINE
out = []
for path in sys.argv[2:]:
    try:
        out.append(full(parse_file(path)))
    except Exception as e:  # the same error must come from both engines
        out.append(("error", type(e).__name__, str(e)))
sys.stdout.buffer.write(pickle.dumps(out))
"""


def _here(path: Path) -> tuple:
    try:
        return full(parse_file(path))
    except Exception as e:  # noqa: BLE001 - compared with the child's
        return ("error", type(e).__name__, str(e))


def _python_engine(paths: list[Path]) -> list[tuple]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(Path(__file__).parent), *map(str, paths)],
        capture_output=True,
        env={**os.environ, "REPRO_PARSE_ENGINE": "python"},
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return pickle.loads(r.stdout)


def _ascii_junk(data: bytes) -> bytes:
    """Junk lines without the non-ASCII one, so the native path reads every block."""
    out = with_junk(data, seed=11)
    return out.decode("utf-8", "replace").encode("ascii", "replace")


VARIANTS = {
    "crlf": crlf,
    "mpi-tags": mpi_tagged,
    "timestamped-tags": lambda d: mpi_tagged(d, timestamp=True),
    "spliced-tags": lambda d: spliced_tags(d, seed=5, every=3),
    "junk": lambda d: with_junk(d, seed=3),  # not ASCII: other rules take the Python path
    "ascii-junk": _ascii_junk,
    "cut-last-line": lambda d: cut_inside_line(d, d.count(b"\n") - 1, 0.6),
}

SYNTHETIC = {
    # past what the scanner converts itself: a 70-digit value, an iteration past int64
    "long-number.log": (
        "DLL 2022-06-07 08:11:20.889682 - (0, 200) total_ips : 1" + "1" * 69 + ".5 \n"
        "DLL 2022-06-07 08:11:21.889682 - (0, 210) total_ips : 1184.3794455241973 \n"
    ),
    "huge-iteration.log": (
        "DLL 2022-06-07 08:11:20.889682 - (0, 92233720368547758070) total_ips : 1142.5 \n"
        "DLL 2022-06-07 08:11:21.889682 - (0, 210) total_ips : 1184.3794455241973 \n"
    ),
    "exponent.log": (
        "DLL 2022-06-07 08:11:20.889682 - (0, 200) total_ips : 1.1426e+03 \n"
        "DLL 2022-06-07 08:11:21.889682 - (1, 210) total_ips : .5 \n"
        "DLL 2022-06-07 08:11:22.889682 - () train_throughput : 1184.37944552419731234 \n"
    ),
}


def test_native_engine_reads_every_built_in_rule() -> None:
    from repro.parsers import PARSERS

    python_only = [(c.name, r.pattern) for c in PARSERS.plugins() for r in c.rules if r.native is None]
    assert python_only == []


def test_every_bundled_log_parses_the_same() -> None:
    paths = reference_logs()
    assert len(paths) > 40
    theirs = _python_engine(paths)
    for path, want in zip(paths, theirs, strict=True):
        assert _here(path) == want, path.relative_to(PUBLISHED)


def test_damaged_and_synthetic_logs_parse_the_same(tmp_path: Path) -> None:
    paths = []
    for i, log in enumerate(representative_logs()):
        data = log.read_bytes()
        for name, make in VARIANTS.items():
            p = tmp_path / f"{i:02d}-{name}-{log.name}"
            p.write_bytes(make(data))
            paths.append(p)
    for name, text in SYNTHETIC.items():
        p = tmp_path / name
        p.write_text(text)
        paths.append(p)
    theirs = _python_engine(paths)
    for path, want in zip(paths, theirs, strict=True):
        assert _here(path) == want, path.name
    long_number = _here(tmp_path / "long-number.log")
    assert long_number[4][0][3][0].value == float("1" * 70 + ".5")  # exactly as float() reads it


def test_scanner_answers_like_re() -> None:
    """The module's own contract, on small inputs."""
    rx = rb"\((?P<epoch>\d+), (?P<iteration>\d+)\) ips : (?P<value>[\d.e+-]+)(?=\s)"
    s = engine.Scanner(rx, 0)
    block = b"a\n(0, 10) ips : 12.5 x (1, 11) ips : 1e3\n\n(2, 12) ips : 7\nend"
    lines, values, its, eps, newlines = s.records(block, 100, 3, 2, 1)
    def col(code: str, data: bytes) -> list:
        a = array(code)
        a.frombytes(data)
        return a.tolist()

    assert col("q", lines) == [102, 102, 104]  # the 7 is followed by a newline; "end" is cut
    assert col("d", values) == [12.5, 1000.0, 7.0]
    assert (col("q", its), col("q", eps), newlines) == ([10, 11, 12], [0, 1, 2], 4)
    found = s.matches(block, 100)
    assert found == [(101 + block.count(b"\n", 0, m.start()), sum(m.regs, ())) for m in re.finditer(rx, block)]
    assert [(line, spans[:2]) for line, spans in found] == [(102, (2, 20)), (102, (23, 40)), (104, (42, 57))]
    assert engine.Scanner(rx, 0, b"no such text").matches(block, 0) == []  # the required text is missing
    # a required text the pattern does not hold would hide matches: the engine derives it from the pattern
    assert engine._required_literal(rx.decode(), 0) == ") ips : "
    with pytest.raises(ValueError, match="PCRE2 cannot compile"):
        engine.Scanner(rb"(unclosed", 0)
    # several scanners at once: file order, a tie in the order of the scanners given
    both = engine._NATIVE_SCAN((engine.Scanner(rb"ips", 0), s), block, 100)
    ips = [m.start() for m in re.finditer(rb"ips", block)]
    assert [(start, rule, line) for start, rule, line, _ in both] == [
        (2, 1, 102), (ips[0], 0, 102), (23, 1, 102), (ips[1], 0, 102), (42, 1, 104), (ips[2], 0, 104)]
    assert engine._NATIVE_SCAN((s,), "é".encode() + block, 0) is None  # not ASCII: Python reads it
    with pytest.raises(TypeError):
        engine._NATIVE_SCAN((rx,), block, 0)


def test_literal_search_is_bytes_in() -> None:
    """``contains`` compares two bytes of the needle 64 and 16 places at a time: needles of every
    length at every place of haystacks long enough for both paths, and where nothing matches."""
    rng = random.Random(5)
    alphabet = b"ab \n]<stdZ:"
    for _ in range(20_000):
        hay = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        needle = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 7)))
        assert engine._NATIVE_CONTAINS(hay, needle) == (needle in hay), (hay, needle)
    hay = bytes(rng.choice(b"abc") for _ in range(1000))
    for needle in (b"PARAMETER arch : ", b"Z", b"]<std", b"zz", b"q" * 40):
        for at in (0, 1, 15, 16, 63, 64, 65, 500, 1000 - len(needle)):
            placed = hay[:at] + needle + hay[at + len(needle) :]
            assert engine._NATIVE_CONTAINS(placed, needle)
            assert not engine._NATIVE_CONTAINS(placed[: at + len(needle) - 1], needle)


def test_start_literal_is_where_every_match_starts() -> None:
    """A scanner given the text its matches start with tries the pattern only there, anchored:
    the same matches as searching everywhere, lookbehinds before that text included."""
    starts = engine._start_literals
    assert starts(r"(?<=ppcls INFO: )Arch : ?\n", 0) == ("Arch :",)
    assert starts(r"\bPARAMETER (x)", 0) == ("PARAMETER x",)
    assert starts(r"'(ab|cd)': (?:'(x)'|y*)", 0) == ("'ab': ", "'cd': ")  # not "'ab': 'x'": every match
    assert starts(r"'(batch_size|dtype)': (x*)", 0) == ("'batch_size': ", "'dtype': ")
    assert starts(r"(?:ab|cd(?:e|fg)h)i", 0) == ("abi", "cdehi", "cdfghi")  # as far as every match is fixed
    assert starts(r"(?:ab|c)d", 0) == ("abd", "cd")
    assert starts(r"(?:ab|)cd", 0) == ("abcd", "cd")
    assert starts(r"(?:ab|)c", 0) == starts(r"[ab]cd", 0) == starts(r"abc", re.IGNORECASE) == ()
    assert starts(r"(?i:ab)cd", 0) == starts("(?:" + "|".join(c * 2 for c in "abcdefghi") + ")x", 0) == ()
    rx = rb"(?<=INFO: )Arch : (\w+)\n"
    block = b"INFO: Arch : a\nx Arch : b\nINFO: Arch : c\nINFO: Arch :\nINFO: Arch : d"
    anywhere, anchored = engine.Scanner(rx, 0), engine.Scanner(rx, 0, b"", (b"Arch : ", b"Ar", b"Z"))
    assert anchored.matches(block, 0) == anywhere.matches(block, 0)
    assert [block[slice(*spans[2:])] for _, spans in anchored.matches(block, 0)] == [b"a", b"c"]


def test_start_texts_of_many_rules_found_in_one_pass() -> None:
    """With four start texts or more, ``scan`` finds the places of all of them in one pass (eight
    groups of texts, fingerprints of their first bytes) and tries each rule there: its matches
    must be each rule's own, at every place of a 32-byte step and in the last places of a block,
    where texts share a group or a fingerprint, where one rule's text is another's prefix or the
    same, and where a rule's match runs over the next place its text occurs."""
    patterns = [rb"ab(c)", rb"abcd", rb"ab(c)d+", rb"'(x|yz)': (\d+)", rb"'(xy|w)': ", rb"Run Pod: (\S+)",
                rb"(?<=INFO: )Arch : ?\n", rb"PAD+LE", rb"Q\w", rb"zz+", rb"abc(?=d)", rb"(?:\$1|\$22)"]
    pieces = [b"abc", b"abcd", b"abcdd", b"'x': 1", b"'yz': 22", b"'xy': ", b"'w': ", b"Run Pod: p1",
              b"INFO: Arch :\n", b"x Arch : \n", b"PADDLE", b"PADLE", b"Q1", b"QQQ", b"zzzz", b"$1", b"$22",
              b"$2", b" ", b"\n", b"a", b"'", b"z"]
    scanners = [engine._native_scanner(p.decode(), 0) for p in patterns]
    assert all(s is not None for s in scanners)
    assert sum(len(engine._start_literals(p.decode(), 0)) for p in patterns) > 8  # groups shared
    rng = random.Random(11)
    for _ in range(2000):
        block = b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60)))
        chosen = rng.sample(range(len(scanners)), rng.randrange(1, len(scanners) + 1))
        natives = tuple(scanners[i] for i in chosen)
        each = [n.matches(block, 3) for n in natives]
        want = sorted((spans[0], i, line, spans) for i, m in enumerate(each) for line, spans in m)
        assert engine._NATIVE_SCAN(natives, block, 3) == want, (block, chosen)
    many = tuple(engine._native_scanner(f"T{i:02d}x", 0) for i in range(40))  # more texts than one pass takes
    block = b"".join(b"T%02dx " % (i % 45) for i in range(200))
    assert [m[:2] for m in engine._NATIVE_SCAN(many, block, 0)] == [
        (5 * i, i % 45) for i in range(200) if i % 45 < 40]


# ---------------------------------------------------------------------------------------------
# rule by rule, on mutated blocks: the scanner's answer, where it gives one, is re's

PIECES = [b"\n", b" ", b"(", b")", b",", b":", b"ips: ", b"total_ips : ", b"[1,0]<stdout>:", b"\r\n", b"\xff",
          b"\xe6\xad\xa3", b"1e5", b"-3.5", b"99999999999999999999", b".5", b"images/s", b"samples/s",
          b"Epoch: ", b" Iteration: ", b"\t", b"\x1c"]


def _mutated(rng: random.Random, data: bytes) -> bytes:
    d = bytearray(data)
    for _ in range(rng.randrange(1, 40)):
        op, at = rng.randrange(3), rng.randrange(len(d) + 1)
        if op == 0:
            d[at:at] = rng.choice(PIECES)
        elif op == 1:
            del d[at : at + rng.randrange(1, 8)]
        else:
            d[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    return bytes(d)


def _col(code: str, data: bytes, missing: bool = False) -> list:
    a = array(code)
    a.frombytes(data)
    return [None if missing and v == -1 else v for v in a]


def _py_ints(col: object) -> list:
    col = engine._eager(col)  # type: ignore[arg-type]
    if isinstance(col, array):
        return [None if v == -1 else v for v in col]
    return list(col)  # type: ignore[call-overload]


@pytest.mark.parametrize("seed", [1, 2])
def test_scanner_agrees_with_re_on_mutated_blocks(seed: int) -> None:
    from repro.parsers import PARSERS

    rng = random.Random(seed)
    logs = [p.read_bytes() for p in representative_logs()]
    rules = [r for c in PARSERS.plugins() for r in c.rules]
    compared = 0
    for _ in range(120):
        src = rng.choice(logs)
        at = rng.randrange(len(src))
        block = _mutated(rng, src[at : at + rng.randrange(100, 20000)])
        for r in rules:
            if r.action == "record":
                rule = engine._RecordRule(r.bregex, r.native)
                got = r.native.records(block, 7, rule.value, rule.iteration, rule.epoch)
                if got is None:  # handed back to Python
                    continue
                (lines, values, its, eps), newlines = rule._columns(block, 7)
                native = (_col("q", got[0]), _col("d", got[1]), _col("q", got[2], 1), _col("q", got[3], 1))
                python = (list(lines), list(values), _py_ints(its), _py_ints(eps))
                assert (native, got[4]) == (python, newlines), (r.pattern, block[:300])
            elif block.isascii():
                found = r.native.matches(block, 7)
                if found is None:
                    continue
                text = block.decode()  # each match's line and the spans of it and its groups
                want = [(8 + text.count("\n", 0, m.start()), sum(m.regs, ())) for m in r.regex.finditer(text)]
                assert found == want, (r.pattern, block[:300])
            compared += 1
        for cls in PARSERS.plugins():  # all of a parser's other rules at once: their matches merged
            natives = tuple(r.native for r in cls.rules if r.action != "record")
            each = [r.matches(block, 7) for r in natives]
            merged = engine._NATIVE_SCAN(natives, block, 7)
            if not block.isascii() or None in each:
                assert merged is None
            else:
                assert merged == sorted((spans[0], i, line, spans) for i, m in enumerate(each) for line, spans in m)
        for rx, stamped in ((engine._MPI_TAG_B, False), (engine._MPI_STAMPED_TAG_B, True)):
            assert engine._NATIVE_STRIP(block, stamped) == rx.sub(b"", block), block[:300]
        for rx, stamped in ((engine._misplaced_tag(False), False), (engine._misplaced_tag(True), True)):
            assert engine._NATIVE_MISPLACED(block, stamped) == (rx.search(block) is not None), block[:300]
    assert compared > 1000


# ---------------------------------------------------------------------------------------------
# numbers: the scanner converts most record values itself, and must read them as float() does


def _decimals(rng: random.Random, n: int) -> list[bytes]:
    """Decimal texts as logs print them, and the hard cases: 16-20 significant digits, leading
    and trailing zeros, exponents, signs, and exact halfway points between two doubles."""
    out = []
    for _ in range(n):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 21)))
        point = rng.randint(0, len(digits))
        text = digits[:point] + "." + digits[point:] if rng.random() < 0.85 else digits
        if rng.random() < 0.2:
            text += rng.choice("eE") + rng.choice(["", "-", "+"]) + str(rng.randint(0, 25))
        if rng.random() < 0.2:
            text = rng.choice("-+") + text
        out.append(text.encode())
    for k in range(53, 68):  # 2**k + 2**(k-53) lies halfway between two doubles
        for d in (-1, 0, 1):
            x = str(2**k + 2 ** (k - 53) + d)
            out += [x.encode(), f"{x[:-4]}.{x[-4:]}".encode(), f"0.{x}".encode()]
    return out


def test_record_values_are_read_exactly_as_float_reads_them() -> None:
    s = engine.Scanner(("v=(?P<value>" + engine.NUM + ")\n").encode(), 0)
    texts = [t for t in _decimals(random.Random(3), 100_000) if re.fullmatch(engine.NUM.encode(), t)]
    got = s.records(b"".join(b"v=" + t + b"\n" for t in texts), 0, 1, 0, 0)
    values = _col("d", got[1])
    assert len(values) == len(texts)
    wrong = [(t, v) for t, v in zip(texts, values) if v.hex() != float(t).hex()]  # -0.0 too
    assert wrong == []


def test_parameter_lookup_in_c_is_the_python_search() -> None:
    keys = ["amp", "xamp", "amp_x", "a", "batch_size", "gpus", "mode", "dali", "data_backend", "arch"]
    compared = 0
    for text in parameter_lines():
        p = engine.Params(text)
        native = engine._NATIVE_PARAM(text, tuple(keys))
        if text.isascii():
            assert native == tuple(map(p._search, keys)), text
            assert p.pick(*keys[::-1]) == native[::-1]
            compared += len(keys)
        else:
            assert native is None  # Python decides
    assert engine._NATIVE_PARAM("a : 1", ("a", "é")) is None
    assert compared > 100_000


def test_native_matches_read_as_re_matches() -> None:
    """Handlers get either a re.Match or the native scanner's stand-in: every way to read one
    gives the same answer, for every rule of every parser on the representative logs."""
    from repro.parsers import PARSERS

    compared = 0
    for log in representative_logs():
        block = log.read_bytes()
        if not block.isascii():
            continue
        text = engine._Text(block)
        for cls in PARSERS.plugins():
            for r in cls.rules:
                if r.action == "record":
                    continue
                found = r.native.matches(block, 0)
                want = list(r.regex.finditer(text.get()))
                assert found is not None and len(found) == len(want), r.pattern
                for (_, spans), m in zip(found, want):
                    f = engine._Found(r.regex, text, spans)
                    names = [0, *range(1, r.regex.groups + 1), *r.regex.groupindex]
                    assert [f.group(g) for g in names] == [m.group(g) for g in names]
                    assert [f[g] for g in names] == [m[g] for g in names]
                    assert [f.span(g) for g in names] == [m.span(g) for g in names]
                    assert (f.groups(), f.groups("-"), f.groupdict(), f.groupdict("-")) == (
                        m.groups(), m.groups("-"), m.groupdict(), m.groupdict("-"))
                    assert (f.start(), f.end(), f.string, f.re) == (m.start(), m.end(), m.string, m.re)
                    if r.regex.groups:
                        assert f.group(0, 1) == m.group(0, 1)
                    with pytest.raises(IndexError):
                        f.group(r.regex.groups + 1)
                    compared += 1
    assert compared > 100


def test_native_match_outside_its_block_is_an_error_not_garbage() -> None:
    """A match is read while its block is handled; one kept past a refill of the block's buffer
    that no longer covers its spans says so instead of reading past the buffer."""
    rx = re.compile(r"(\w+) (?P<second>\w+)")
    block = bytearray(b"abc defg\n")
    f = engine._Found(rx, engine._Text(block), (0, 8, 0, 3, 4, 8))
    assert (f.group(), f[1], f["second"], f.span(2)) == ("abc defg", "abc", "defg", (4, 8))
    assert (f.groups(), f.groupdict()) == (("abc", "defg"), {"second": "defg"})
    del block[5:]
    assert f.group(1) == "abc"
    with pytest.raises(ValueError, match="refilled"):
        f.group("second")
    for bad in ((0,), (0, 1, 2)):
        with pytest.raises(ValueError):
            engine._Found(rx, engine._Text(block), bad)


@pytest.mark.parametrize("stamped", [False, True])
def test_tag_search_and_removal_in_c_are_the_expressions(stamped: bool) -> None:
    rx = engine._misplaced_tag(stamped)
    stamp = b"Mon Jun 13 17:45:27 2022" if stamped else b""
    heads = [b"[1,0]", b"[12,3456]", b"[123,1]", b"[1234,0]", b"[1,12345]", b"[,1]", b"[1,]", b"1,0]", b"[a,0]",
             b"[1,2,3]", b"x[1,0]", b"Mon Jun 13 17:45:27 2022[1,0]", b"Mon Jun  3 17:45:27 2022[1,0]",
             b"mon Jun 13 17:45:27 2022[1,0]", b"Jun 13 17:45:27 2022[1,0]"]
    rng = random.Random(7)
    for _ in range(3000):
        lines = []
        for _ in range(rng.randrange(1, 5)):
            head = rng.choice(heads)
            tail = rng.choice([b"<stdout>:a", b"<stderr>:b", b"<stdin>:c", b"<std", b""])
            lines.append(rng.choice([b"", stamp, b" "]) + head + tail + rng.choice([b"", b" x]<stdout>:y"]))
        block = b"\n".join(lines) + rng.choice([b"", b"\n"])
        assert engine._NATIVE_MISPLACED(block, stamped) == (rx.search(block) is not None), block
        tags = engine._MPI_STAMPED_TAG_B if stamped else engine._MPI_TAG_B
        assert engine._NATIVE_STRIP(block, stamped) == tags.sub(b"", block), block
    for _ in range(300):  # long blocks: tags on every line, across the 64-byte steps of the search
        lines = [rng.choice([b"", stamp]) + b"[1,0]<stdout>:" + b"x" * rng.randrange(90) for _ in range(200)]
        for _ in range(rng.randrange(3)):  # a tag out of place, now and then
            at = rng.randrange(len(lines))
            lines[at] = lines[at][:30] + rng.choice(heads) + b"<stderr>:" + lines[at][30:]
        block = b"\n".join(lines) + rng.choice([b"", b"\n", b"]<std"])
        tags = engine._MPI_STAMPED_TAG_B if stamped else engine._MPI_TAG_B
        assert engine._NATIVE_MISPLACED(block, stamped) == (rx.search(block) is not None), block
        want = tags.sub(b"", block)
        assert engine._NATIVE_STRIP(block, stamped) == want, block
        out = bytearray(rng.randrange(2 * len(block)))  # a buffer refilled, of any size before
        assert engine._NATIVE_STRIP(block, stamped, out) is out and out == want
        inner = bytearray(block)  # the block is the buffer: text moves only towards the start
        assert engine._NATIVE_STRIP(inner, stamped, inner) == want
    for block in (b"[1,0]<stdout>:[1,0]<stderr>:x", b"[1,2]<stdout>:3,4]<stdout>:", b"[[1,2]<stdout>:",
                  b"[1,2]<stdout>:[3,4]<stdout>", b"[1,2" + stamp + b"[3,4]<stdout>:", b"]<stdout>:"):
        tags = engine._MPI_STAMPED_TAG_B if stamped else engine._MPI_TAG_B
        assert engine._NATIVE_STRIP(block, stamped) == tags.sub(b"", block), block


def test_value_range_is_min_and_max() -> None:
    from repro.parsers import Series

    rng = random.Random(9)
    pool = [0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), -float("inf"), 1e-300, 3.0]
    for n in range(1, 200):
        values = [rng.choice(pool) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6) for _ in range(n % 40 + 1)]
        s = Series(gpus=None, records=[engine.Record(v) for v in values])
        assert repr(s.value_range()) == repr((min(values), max(values)))
    assert Series(gpus=None).value_range() is None


def test_exact_sum_is_math_fsum() -> None:
    """The native sum of a value column is math.fsum's, to the last bit: throughput-like figures,
    cancellations across magnitudes, halfway cases between partials, and the values math.fsum
    itself must answer (infinities, NaN, overflow) handed back to it."""
    import math

    rng = random.Random(13)
    cases = [[], [0.0], [-0.0], [1e-16, 1.0, 1e16], [1.0, 1e100, 1.0, -1e100], [2.0**53, 1.0, 2.0**-60]]
    for n in range(3000):
        k = rng.randrange(1, 300)
        scale = rng.choice([1.0, 1e3, 1e-10, 1e280])
        values = [rng.uniform(-1, 1) * scale * rng.choice([1.0, 2.0**rng.randrange(-60, 60)]) for _ in range(k)]
        if n % 3 == 0:
            values = [abs(v) * 1e3 + 1000 for v in values]  # images/s: positive, 16-17 digits
        cases.append(values)
    for values in cases:
        col = array("d", values)
        assert engine.exact_sum(col).hex() == math.fsum(values).hex(), values[:5]
    for special in ([1.0, float("inf")], [float("nan")], [1e308, 1e308]):
        assert engine._NATIVE_FSUM(array("d", special)) is None
    with pytest.raises(OverflowError):
        engine.exact_sum(array("d", [1e308, 1e308]))
