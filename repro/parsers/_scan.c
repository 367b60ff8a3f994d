/* Native scanner for the parser engine (repro.parsers.base): one rule's regular expression run
 * over a block of log bytes with PCRE2's JIT, the records collected straight into columns.
 *
 * The Python engine stays the reference: this module only answers questions the engine asks
 * of a rule and a block, and answers None whenever its answer could differ from what the
 * Python code would compute (a number too long to convert here, an iteration past int64, a
 * match-limit error), so the caller takes the Python path for that block.
 *
 *   Scanner(pattern: bytes, flags: int, required: bytes = b"", starts: tuple[bytes, ...] = ())
 *       compile (raises ValueError if PCRE2 cannot); `required`: text every match holds (a block
 *       without it is skipped at once), `starts`: texts one of which every match starts with
 *       (the pattern is then tried only where one of them occurs; at most 8)
 *   Scanner.records(block, base, value, iteration, epoch)
 *       -> (lines, values, iterations, epochs, newlines) | None
 *          lines/iterations/epochs: bytes of native int64, values: bytes of double; a group
 *          that took no part in a match is -1; group index 0 means "no such group".
 *   Scanner.matches(block, base) -> list[tuple[int, tuple[int, ...]]] | None
 *       every successive match: its line and the spans of the match and of each group
 *
 * and functions for the engine's other work on blocks and columns, each described where it is
 * defined: scan (the matches of several scanners at once), contains, param, misplaced_tag,
 * strip_tags, value_range, fsum.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <string.h>

/* flags the Python side passes (re module values) */
#define RE_IGNORECASE 2
#define RE_MULTILINE 8
#define RE_DOTALL 16
#define RE_VERBOSE 64

#define MAX_NUMBER 64 /* longer value groups go back to Python */

/* ---- literal search ---------------------------------------------------------------------------
 * glibc's memmem reads a log at 2-4 GB/s, and a needle that is absent (the usual case for the
 * literals a rule requires) costs the whole block. Here the two rarest bytes of the needle, by a
 * guess at byte frequencies in logs, are compared at 16 places at once (SSE2), and only a place
 * where both agree is compared in full: near memchr's speed when the bytes are rare. */
typedef struct {
    const char *s;
    size_t n, i1, i2; /* offsets of the rarest and the second rarest byte */
} Needle;

static unsigned char BYTE_RANK[256]; /* higher: more frequent in training logs (set at import) */

static void byte_ranks_init(void) {
    static const char common[] = " e0t1a2o.3i4n5s6r7:8l9h\ndc_u,-m/pf=g[]()wybvk'\"xjqz";
    for (int c = 'A'; c <= 'Z'; c++) BYTE_RANK[c] = 1;
    for (size_t i = 0; i < sizeof common - 1; i++) BYTE_RANK[(unsigned char)common[i]] = (unsigned char)(sizeof common - i);
}

static int have_avx2; /* the CPU runs the AVX2 paths (set at import) */

static void needle_init(Needle *nd, const char *s, size_t n) {
    nd->s = s;
    nd->n = n;
    nd->i1 = nd->i2 = 0;
    for (size_t i = 1; i < n; i++)
        if (BYTE_RANK[(unsigned char)s[i]] < BYTE_RANK[(unsigned char)s[nd->i1]]) nd->i1 = i;
    nd->i2 = nd->i1 == 0 && n > 1 ? 1 : 0;
    for (size_t i = 0; i < n; i++)
        if (i != nd->i1 && BYTE_RANK[(unsigned char)s[i]] < BYTE_RANK[(unsigned char)s[nd->i2]]) nd->i2 = i;
}

/* the first place from *pp on where the needle starts, looking 64 places at a time while all of
 * them start at or before `last`; NULL if none, with *pp at the first place not looked at */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
__attribute__((target("avx2"))) static const char *needle_find_avx2(const Needle *nd, const char **pp,
                                                                    const char *last) {
    const char *p = *pp;
    const __m256i v1 = _mm256_set1_epi8(nd->s[nd->i1]), v2 = _mm256_set1_epi8(nd->s[nd->i2]);
    for (; last - p >= 63; p += 64) {
        const char *a = p + nd->i1, *b = p + nd->i2;
        __m256i lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)a), v1),
                                      _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)b), v2));
        __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(a + 32)), v1),
                                      _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(b + 32)), v2));
        if (_mm256_testz_si256(_mm256_or_si256(lo, hi), _mm256_or_si256(lo, hi))) continue;
        uint64_t mask = (uint32_t)_mm256_movemask_epi8(lo) | (uint64_t)(uint32_t)_mm256_movemask_epi8(hi) << 32;
        while (mask) {
            const char *at = p + __builtin_ctzll(mask);
            if (!memcmp(at, nd->s, nd->n)) return at;
            mask &= mask - 1;
        }
    }
    *pp = p;
    return NULL;
}
#endif

/* the first place in [p, end) where the needle starts, or NULL */
static const char *needle_find(const Needle *nd, const char *p, const char *end) {
    size_t n = nd->n;
    if (n == 0) return p;
    if ((size_t)(end - p) < n) return NULL;
    if (n == 1) return memchr(p, nd->s[0], (size_t)(end - p));
    const char *last = end - n; /* the last place a match can start */
    const char c1 = nd->s[nd->i1], c2 = nd->s[nd->i2];
#ifdef HAVE_AVX2_PATH
    if (have_avx2) {
        const char *at = needle_find_avx2(nd, &p, last);
        if (at) return at;
    }
#endif
#ifdef __SSE2__
    const __m128i v1 = _mm_set1_epi8(c1), v2 = _mm_set1_epi8(c2);
    for (; last - p >= 15; p += 16) { /* places p .. p+15, whose needles end before `end` */
        __m128i a = _mm_loadu_si128((const __m128i *)(p + nd->i1));
        __m128i b = _mm_loadu_si128((const __m128i *)(p + nd->i2));
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, v1), _mm_cmpeq_epi8(b, v2)));
        while (mask) {
            const char *at = p + __builtin_ctz(mask);
            if (!memcmp(at, nd->s, n)) return at;
            mask &= mask - 1;
        }
    }
#endif
    for (; p <= last; p++)
        if (p[nd->i1] == c1 && p[nd->i2] == c2 && !memcmp(p, nd->s, n)) return p;
    return NULL;
}

/* Successive places of a needle found often (an MPI tag on every line): the candidates of 64
 * places are kept between calls, where needle_find would set up and search them again for each.
 * needle_next(it, p): the first place from p on where the needle starts, or NULL; p never goes
 * back between calls. */
typedef struct {
    const Needle *nd;
    const char *end;
    const char *chunk; /* the first of the 64 places `mask` holds candidates of (NULL: none yet) */
    uint64_t mask;     /* places where the needle's two rarest bytes are */
} NeedleIter;

static inline void needle_iter_init(NeedleIter *it, const Needle *nd, const char *end) {
    *it = (NeedleIter){nd, end, NULL, 0};
}

#ifdef HAVE_AVX2_PATH
/* the mask needle_find_avx2 computes in its loop; that loop keeps its own copy, which tests a
 * chunk with no candidate without the two movemasks (13% more instructions for PaddleClas logs
 * when it called this) */
__attribute__((target("avx2"))) static uint64_t needle_mask64(const Needle *nd, const char *p) {
    const __m256i v1 = _mm256_set1_epi8(nd->s[nd->i1]), v2 = _mm256_set1_epi8(nd->s[nd->i2]);
    const char *a = p + nd->i1, *b = p + nd->i2;
    __m256i lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)a), v1),
                                  _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)b), v2));
    __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(a + 32)), v1),
                                  _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(b + 32)), v2));
    return (uint32_t)_mm256_movemask_epi8(lo) | (uint64_t)(uint32_t)_mm256_movemask_epi8(hi) << 32;
}
#endif

static const char *needle_next(NeedleIter *it, const char *p) {
#ifdef HAVE_AVX2_PATH
    const Needle *nd = it->nd;
    if (have_avx2 && nd->n > 1 && (size_t)(it->end - p) >= nd->n) {
        const char *last = it->end - nd->n; /* the last place a match can start */
        if (!it->chunk || p < it->chunk || p - it->chunk >= 64) {
            it->chunk = p;
            it->mask = last - p >= 63 ? needle_mask64(nd, p) : 0;
        } else {
            it->mask &= ~0ULL << (p - it->chunk); /* not before p */
        }
        while (last - it->chunk >= 63) {
            for (; it->mask; it->mask &= it->mask - 1) {
                const char *at = it->chunk + __builtin_ctzll(it->mask);
                if (!memcmp(at, nd->s, nd->n)) {
                    it->mask &= it->mask - 1;
                    return at;
                }
            }
            it->chunk += 64;
            if (last - it->chunk >= 63) it->mask = needle_mask64(nd, it->chunk);
        }
        p = it->chunk > p ? it->chunk : p; /* the last places: fewer than 64 */
    }
#endif
    return needle_find(it->nd, p, it->end);
}

static inline const char *find_bytes(const char *p, const char *end, const char *s, size_t n) {
    Needle nd;
    needle_init(&nd, s, n);
    return needle_find(&nd, p, end);
}

/* a literal a scanner looks for, held by the scanner */
typedef struct {
    char *text; /* NULL: none */
    Needle nd;
} Literal;

static int literal_set(Literal *lit, const char *s, Py_ssize_t n) {
    PyMem_Free(lit->text);
    lit->text = NULL;
    if (n <= 0) return 0;
    if (!(lit->text = PyMem_Malloc((size_t)n))) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(lit->text, s, (size_t)n);
    needle_init(&lit->nd, lit->text, (size_t)n);
    return 0;
}

typedef struct {
    pcre2_code *code;
    int jit;
} Compiled;

static void compiled_free(Compiled *c) {
    if (c->code) pcre2_code_free(c->code);
    c->code = NULL;
}

/* a growable column of 8-byte items */
typedef struct {
    char *data;
    size_t n, cap;
} Column;

static inline int col_push(Column *c, const void *item) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 1024;
        char *d = PyMem_Realloc(c->data, cap * 8);
        if (!d) return -1;
        c->data = d;
        c->cap = cap;
    }
    memcpy(c->data + 8 * c->n++, item, 8);
    return 0;
}

#define MAX_STARTS 8

typedef struct {
    PyObject_HEAD
    Compiled any;      /* the pattern */
    Compiled anchored; /* the pattern anchored where a search starts (only with `starts`) */
    Literal required;  /* text every match holds: a block without it has none */
    Literal starts[MAX_STARTS]; /* texts one of which every match starts with */
    int nstarts;       /* 0: matches are searched for everywhere */
    /* records() fills these (line, value, iteration, epoch), kept from call to call: grown
     * afresh for every block, they cost a page fault every 4 KiB written (the GIL is held) */
    Column cols[4];
} Scanner;

static void Scanner_dealloc(Scanner *self) {
    compiled_free(&self->any);
    compiled_free(&self->anchored);
    PyMem_Free(self->required.text);
    for (int i = 0; i < MAX_STARTS; i++) PyMem_Free(self->starts[i].text);
    for (int i = 0; i < 4; i++) PyMem_Free(self->cols[i].data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int compile(Compiled *out, const char *pat, size_t len, uint32_t options) {
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        PyErr_NoMemory();
        return -1;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_set_bsr(cc, PCRE2_BSR_ANYCRLF);
    int err;
    PCRE2_SIZE at;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pat, (PCRE2_SIZE)len, options, &err, &at, cc);
    pcre2_compile_context_free(cc);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        PyErr_Format(PyExc_ValueError, "PCRE2 cannot compile the pattern at %zu: %s", (size_t)at, msg);
        return -1;
    }
    compiled_free(out);
    out->code = code;
    out->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"pattern", "flags", "required", "starts", NULL};
    Py_buffer pat;
    int flags = 0;
    const char *required = NULL;
    Py_ssize_t required_len = 0;
    PyObject *starts = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|iy#O!", kwlist, &pat, &flags, &required, &required_len,
                                     &PyTuple_Type, &starts))
        return -1;
    Py_ssize_t nstarts = starts ? PyTuple_GET_SIZE(starts) : 0;
    if (nstarts > MAX_STARTS) {
        PyBuffer_Release(&pat);
        PyErr_Format(PyExc_ValueError, "at most %d start texts", MAX_STARTS);
        return -1;
    }
    uint32_t options = PCRE2_NO_UTF_CHECK;
    if (flags & RE_IGNORECASE) options |= PCRE2_CASELESS;
    if (flags & RE_MULTILINE) options |= PCRE2_MULTILINE;
    if (flags & RE_DOTALL) options |= PCRE2_DOTALL;
    if (flags & RE_VERBOSE) options |= PCRE2_EXTENDED;
    compiled_free(&self->anchored);
    self->nstarts = 0;
    int rc = literal_set(&self->required, required, required_len);
    for (Py_ssize_t i = 0; !rc && i < nstarts; i++) {
        PyObject *item = PyTuple_GET_ITEM(starts, i);
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) == 0) {
            PyErr_SetString(PyExc_TypeError, "start texts must be non-empty bytes");
            rc = -1;
        } else {
            rc = literal_set(&self->starts[i], PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item));
        }
    }
    rc = rc || compile(&self->any, pat.buf, (size_t)pat.len, options) ||
         (nstarts > 0 && compile(&self->anchored, pat.buf, (size_t)pat.len, options | PCRE2_ANCHORED));
    if (!rc) self->nstarts = (int)nstarts;
    PyBuffer_Release(&pat);
    return rc ? -1 : 0;
}

static inline int run(const Compiled *c, const char *buf, size_t len, size_t off, pcre2_match_data *md) {
    if (c->jit) return pcre2_jit_match(c->code, (PCRE2_SPTR)buf, len, off, 0, md, NULL);
    return pcre2_match(c->code, (PCRE2_SPTR)buf, len, off, 0, md, NULL);
}

/* where each start text next occurs, during one scan of a block (zeroed: nothing looked up) */
typedef struct {
    const char *at[MAX_STARTS]; /* the next place found, valid while >= the place asked about */
    char none[MAX_STARTS];      /* no place left in the block */
} Starts;

/* the first match at or after `off`, as pcre2_match answers: with start texts, the pattern is
 * tried, anchored, at each place one of them occurs (a match can start nowhere else) */
static int next_match(Scanner *s, const char *buf, size_t len, size_t off, pcre2_match_data *md, Starts *st) {
    if (!s->nstarts) return run(&s->any, buf, len, off, md);
    const char *end = buf + len, *p = buf + off;
    while (p < end) {
        const char *first = NULL;
        for (int i = 0; i < s->nstarts; i++) {
            if (st->none[i]) continue;
            if (!st->at[i] || st->at[i] < p) {
                st->at[i] = needle_find(&s->starts[i].nd, p, end);
                st->none[i] = !st->at[i];
            }
            if (st->at[i] && (!first || st->at[i] < first)) first = st->at[i];
        }
        if (!first) break;
        int rc = run(&s->anchored, buf, len, (size_t)(first - buf), md);
        if (rc != PCRE2_ERROR_NOMATCH) return rc;
        p = first + 1;
    }
    return PCRE2_ERROR_NOMATCH;
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2,popcnt"))) static int64_t count_newlines_avx2(const char *p, const char *end) {
    const __m256i nl = _mm256_set1_epi8('\n');
    int64_t n = 0;
    for (; end - p >= 32; p += 32)
        n += __builtin_popcount((unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), nl)));
    for (; p < end; p++) n += *p == '\n';
    return n;
}

__attribute__((target("avx2,popcnt"))) static int64_t count_newlines_avx2_in(const char *p, const char *end,
                                                                             const char *limit) {
    const __m256i nl = _mm256_set1_epi8('\n');
    int64_t n = 0;
    for (; end - p >= 32; p += 32)
        n += __builtin_popcount((unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), nl)));
    if (p == end) return n;
    if (limit - p < 32) return n + count_newlines_avx2(p, end);
    unsigned mask = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)p), nl));
    return n + __builtin_popcount(mask & ((1u << (end - p)) - 1));
}
#endif

static inline int64_t count_newlines(const char *p, const char *end) {
#ifdef HAVE_AVX2_PATH
    if (have_avx2) return count_newlines_avx2(p, end);
#endif
    int64_t n = 0;
#ifdef __SSE2__
    /* 16 bytes at a time: each lane counts its newlines (a match is -1, subtracted), and the
     * lanes are summed before any can pass 255 */
    const __m128i nl = _mm_set1_epi8('\n'), zero = _mm_setzero_si128();
    while (end - p >= 16) {
        __m128i acc = zero;
        for (int k = 0; k < 255 && end - p >= 16; k++, p += 16)
            acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), nl));
        __m128i sums = _mm_sad_epu8(acc, zero);
        n += _mm_cvtsi128_si32(sums) + _mm_cvtsi128_si32(_mm_srli_si128(sums, 8));
    }
#endif
    for (; p < end; p++) n += *p == '\n';
    return n;
}

/* count_newlines(p, end) where the buffer goes on to `limit`: the last partial 32 bytes are read
 * whole and masked when the buffer holds them (the gaps between records are a line or two long,
 * and a byte loop over their ends cost more than their vectors) */
static inline int64_t count_newlines_in(const char *p, const char *end, const char *limit) {
#ifdef HAVE_AVX2_PATH
    if (have_avx2 && limit - p >= 32) return count_newlines_avx2_in(p, end, limit);
#endif
    return count_newlines(p, end);
}

/* can a match occur in this block at all? (the required text is in it, or none is known) */
static inline int may_match(Scanner *s, const char *buf, size_t len) {
    return !s->required.text || needle_find(&s->required.nd, buf, buf + len) != NULL;
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* -1: group unset; -2: not a plain run of at most 18 digits (Python decides) */
static int64_t digits(const char *buf, PCRE2_SIZE *ov, int group) {
    PCRE2_SIZE a = ov[2 * group], b = ov[2 * group + 1];
    if (a == PCRE2_UNSET) return -1;
    if (b <= a || b - a > 18) return -2;
    int64_t v = 0;
    for (PCRE2_SIZE i = a; i < b; i++) {
        if (!is_digit(buf[i])) return -2;
        v = v * 10 + (buf[i] - '0');
    }
    return v;
}

/* ---- decimal text to double, exactly as Python's float() reads it ----------------------------
 * PyOS_string_to_double is correctly rounded but slow for the 16-17 digit figures training
 * scripts print (it also switches the x87 control word on every call). Here a number of at most
 * 19 significant digits and a decimal exponent within +-19 is converted with 128-bit integer
 * arithmetic: the digits w and the power of ten are exact, so w * 10^q (q >= 0) is an exact
 * integer and w / 10^-q an exact quotient plus a "remainder is not zero" bit; either is then
 * rounded once to 53 bits, half to even. That is the correctly rounded result float() gives.
 * Digits that fit 53 bits take one double operation instead (exact operands, one rounding).
 * Anything else (more digits, larger exponents, other syntax) returns 0 and the caller asks
 * PyOS_string_to_double. */
typedef unsigned __int128 u128;

static const uint64_t POW10[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
    1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
    100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL, 10000000000000000000ULL,
};

static inline int bit_length(u128 n) {
    uint64_t hi = (uint64_t)(n >> 64), lo = (uint64_t)n;
    return hi ? 128 - __builtin_clzll(hi) : lo ? 64 - __builtin_clzll(lo) : 0;
}

/* n * 2^e2 rounded to a double, half to even; `inexact`: the true value lies strictly above n
 * (only ever set with n of more than 54 bits, so the sticky bit falls below the rounding bit) */
static double round_binary(u128 n, int inexact, int e2) {
    int bits = bit_length(n);
    if (bits <= 53) return ldexp((double)(uint64_t)n, e2);
    int shift = bits - 53;
    uint64_t m = (uint64_t)(n >> shift);
    u128 rem = n & (((u128)1 << shift) - 1), half = (u128)1 << (shift - 1);
    if (rem > half || (rem == half && (inexact || (m & 1)))) {
        if (++m == (1ULL << 53)) {
            m >>= 1;
            shift++;
        }
    }
    return ldexp((double)m, e2 + shift);
}

/* Eight ASCII digits at once, in one 64-bit word (little-endian: the first digit is the low
 * byte): whether all eight are digits, and their value (three multiplications, pairs of digits,
 * then fours, then the eight). Figures in logs run to 16-17 digits. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR_DIGITS 1
static inline uint64_t load8(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline int eight_digits(uint64_t v) {
    return ((v & 0xF0F0F0F0F0F0F0F0ULL) | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) ==
           0x3333333333333333ULL;
}

static inline uint64_t eight_digits_value(uint64_t v) {
    v -= 0x3030303030303030ULL;
    v = v * 10 + (v >> 8);
    return (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
            (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
}
#endif

/* where the run of digits from p on ends */
static inline const char *digits_end(const char *p, const char *end) {
#ifdef SWAR_DIGITS
    while (end - p >= 8 && eight_digits(load8(p))) p += 8;
#endif
    while (p < end && (unsigned char)(*p - '0') <= 9) p++;
    return p;
}

/* w followed by the digits [p, q) */
static inline uint64_t append_digits(uint64_t w, const char *p, const char *q) {
#ifdef SWAR_DIGITS
    for (; q - p >= 8; p += 8) w = w * 100000000 + eight_digits_value(load8(p));
#endif
    for (; p < q; p++) w = w * 10 + (uint64_t)(*p - '0');
    return w;
}

static int exact_decimal(const char *s, size_t n, double *out) {
    const char *p = s, *end = s + n;
    int neg = 0;
    if (p < end && (*p == '+' || *p == '-')) neg = *p++ == '-';
    const char *ia = p, *ib = digits_end(p, end), *fa = ib, *fb = ib; /* integer and fraction digits */
    if (ib < end && *ib == '.') fb = digits_end(fa = ib + 1, end);
    if (ia == ib && fa == fb) return 0;
    long frac = fb - fa, e = 0;
    p = fb;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        if (p == end || !is_digit(*p)) return 0;
        for (; p < end && is_digit(*p); p++) {
            if (e > 100000) return 0;
            e = e * 10 + (*p - '0');
        }
        if (eneg) e = -e;
    }
    if (p != end) return 0;
    /* the significant digits, from the first that is not zero: at most 19 */
    while (ia < ib && *ia == '0') ia++;
    if (ia == ib)
        while (fa < fb && *fa == '0') fa++;
    if ((ib - ia) + (fb - fa) > 19) return 0;
    uint64_t w = append_digits(append_digits(0, ia, ib), fa, fb);
    double v;
    long q = e - frac;
    if (w == 0) {
        v = 0.0;
    } else if (w <= (1ULL << 53) && q >= -19 && q <= 19) {
        /* w and 10^|q| are exact doubles, and one IEEE multiplication or division rounds
         * correctly (half to even): Clinger's fast path, most figures of 16 digits or fewer */
        v = q >= 0 ? (double)w * (double)POW10[q] : (double)w / (double)POW10[-q];
    } else if (q >= 0 && q <= 19) {
        v = round_binary((u128)w * POW10[q], 0, 0);
    } else if (q < 0 && q >= -19) {
        int lz = __builtin_clzll(w);
        u128 num = (u128)(w << lz) << 64, den = POW10[-q];
        u128 quo = num / den;
        v = round_binary(quo, num - quo * den != 0, -64 - lz);
    } else {
        return 0;
    }
    *out = neg ? -v : v;
    return 1;
}

static PyObject *Scanner_records(Scanner *self, PyObject *args) {
    Py_buffer blk;
    long long base;
    int vg, ig, eg;
    if (!PyArg_ParseTuple(args, "y*Liii", &blk, &base, &vg, &ig, &eg)) return NULL;
    uint32_t groups;
    pcre2_pattern_info(self->any.code, PCRE2_INFO_CAPTURECOUNT, &groups);
    if (vg <= 0 || (uint32_t)vg > groups || ig < 0 || (uint32_t)ig > groups || eg < 0 || (uint32_t)eg > groups) {
        PyBuffer_Release(&blk);
        PyErr_SetString(PyExc_ValueError, "group index out of range");
        return NULL;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(self->any.code, NULL);
    if (!md) {
        PyBuffer_Release(&blk);
        return PyErr_NoMemory();
    }
    const char *buf = blk.buf;
    size_t len = (size_t)blk.len, off = 0, counted = 0;
    int64_t line = base + 1;
    Column *cl = &self->cols[0], *cv = &self->cols[1], *ci = &self->cols[2], *ce = &self->cols[3];
    cl->n = cv->n = ci->n = ce->n = 0;
    int fallback = 0, nomem = 0;
    char num[MAX_NUMBER + 1];
    int may = may_match(self, buf, len);
    Starts starts = {0};
    while (may && off <= len) {
        int rc = next_match(self, buf, len, off, md, &starts);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { /* match or depth limit: let Python decide */
            fallback = 1;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        line += count_newlines_in(buf + counted, buf + ov[0], buf + len);
        counted = ov[0];
        PCRE2_SIZE a = ov[2 * vg], b = ov[2 * vg + 1];
        if (a == PCRE2_UNSET || b <= a || b - a > MAX_NUMBER || memchr(buf + a, '_', b - a)) {
            fallback = 1;
            break;
        }
        double value;
        if (!exact_decimal(buf + a, b - a, &value)) {
            memcpy(num, buf + a, b - a);
            num[b - a] = 0;
            char *end;
            value = PyOS_string_to_double(num, &end, NULL);
            if (value == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                fallback = 1;
                break;
            }
            if (end != num + (b - a)) {
                fallback = 1;
                break;
            }
        }
        int64_t it = ig ? digits(buf, ov, ig) : -1, ep = eg ? digits(buf, ov, eg) : -1;
        if (it == -2 || ep == -2) {
            fallback = 1;
            break;
        }
        if (col_push(cl, &line) || col_push(cv, &value) || col_push(ci, &it) || col_push(ce, &ep)) {
            nomem = 1;
            break;
        }
        if (ov[1] > ov[0]) {
            off = ov[1];
        } else { /* an empty match: a record rule never makes one; Python decides */
            fallback = 1;
            break;
        }
    }
    pcre2_match_data_free(md);
    PyObject *out = NULL;
    if (nomem) {
        PyErr_NoMemory();
    } else if (fallback) {
        out = Py_NewRef(Py_None);
    } else {
        int64_t newlines = (line - base - 1) + count_newlines(buf + counted, buf + len);
        out = Py_BuildValue("(y#y#y#y#L)", cl->data ? cl->data : "", (Py_ssize_t)(8 * cl->n),
                            cv->data ? cv->data : "", (Py_ssize_t)(8 * cv->n), ci->data ? ci->data : "",
                            (Py_ssize_t)(8 * ci->n), ce->data ? ce->data : "", (Py_ssize_t)(8 * ce->n),
                            (long long)newlines);
    }
    PyBuffer_Release(&blk);
    return out;
}

/* ---- matches of rules other than records -------------------------------------------------------
 * A handful a run (boundaries, summaries, facts): each match's start, rule and spans are kept,
 * ordered by (start, rule) and given their lines in one count over the block. */
typedef struct {
    size_t start;
    int rule;
    size_t at, n; /* its spans in the pool: (start0, end0, start1, end1, ...), -1 where unset */
} Hit;

typedef struct {
    Hit *items;
    size_t n, cap;
    Py_ssize_t *pool; /* the spans of all hits */
    size_t pool_n, pool_cap;
} Hits;

static void hits_free(Hits *h) {
    PyMem_Free(h->items);
    PyMem_Free(h->pool);
    *h = (Hits){0};
}

static int hits_push(Hits *h, size_t start, int rule, const PCRE2_SIZE *ov, size_t nspans) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        Hit *items = PyMem_Realloc(h->items, cap * sizeof(Hit));
        if (!items) goto nomem;
        h->items = items;
        h->cap = cap;
    }
    if (h->pool_n + nspans > h->pool_cap) {
        size_t cap = 2 * (h->pool_cap + nspans);
        Py_ssize_t *pool = PyMem_Realloc(h->pool, cap * sizeof(Py_ssize_t));
        if (!pool) goto nomem;
        h->pool = pool;
        h->pool_cap = cap;
    }
    for (size_t i = 0; i < nspans; i++) h->pool[h->pool_n + i] = ov[i] == PCRE2_UNSET ? -1 : (Py_ssize_t)ov[i];
    h->items[h->n++] = (Hit){start, rule, h->pool_n, nspans};
    h->pool_n += nspans;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* keep the match pcre2 answered `rc` for (not NOMATCH) as a hit of `rule` with its `groups`, and
 * set *off past it: 0, 1 where Python must decide (a match or depth limit, an empty match), -1 on
 * an error */
static int keep_match(Hits *hits, int rule, int rc, pcre2_match_data *md, uint32_t groups, size_t *off) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (rc < 0 || ov[1] == ov[0]) return 1;
    if (hits_push(hits, ov[0], rule, ov, 2 * (size_t)(groups + 1)) < 0) return -1;
    *off = ov[1];
    return 0;
}

/* every successive match of `s` in the block, as hits of `rule`: 0, 1 where Python must decide
 * (a match or depth limit, an empty match), -1 on an error */
static int collect(Scanner *s, const char *buf, size_t len, int rule, Hits *hits) {
    if (!may_match(s, buf, len)) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(s->any.code, NULL);
    if (!md) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t groups = 0;
    pcre2_pattern_info(s->any.code, PCRE2_INFO_CAPTURECOUNT, &groups);
    Starts starts = {0};
    int status = 0;
    for (size_t off = 0; !status && off <= len;) {
        int rc = next_match(s, buf, len, off, md, &starts);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        status = keep_match(hits, rule, rc, md, groups, &off);
    }
    pcre2_match_data_free(md);
    return status;
}

static int hit_order(const void *a, const void *b) {
    const Hit *x = a, *y = b;
    return x->start != y->start ? (x->start < y->start ? -1 : 1) : (x->rule > y->rule) - (x->rule < y->rule);
}

/* ---- a match for handlers ------------------------------------------------------------------
 * Found(pattern, text, spans): a match the native scan found in an ASCII block, read as a
 * re.Match (group, [g], groups, groupdict, start, end, span, string, re). `text` is the block's
 * repro.parsers.base._Text: a group's text is cut from its .block when asked for, .string is its
 * get(); `spans` are (start, end) of the match and of each group, -1 where unset. The spans live
 * in the object: a handler's match costs one allocation, and nothing is decoded it does not read. */
typedef struct {
    PyObject_VAR_HEAD /* ob_size: the number of spans */
    PyObject *re, *text, *block;
    Py_ssize_t spans[1];
} Found;

static PyTypeObject FoundType;

static Found *found_new(PyObject *re, PyObject *text, PyObject *block, const Py_ssize_t *spans, Py_ssize_t n) {
    Found *f = PyObject_NewVar(Found, &FoundType, n);
    if (!f) return NULL;
    f->re = Py_NewRef(re);
    f->text = Py_NewRef(text);
    f->block = Py_NewRef(block);
    memcpy(f->spans, spans, (size_t)n * sizeof(Py_ssize_t));
    return f;
}

static void Found_dealloc(Found *f) {
    Py_DECREF(f->re);
    Py_DECREF(f->text);
    Py_DECREF(f->block);
    PyObject_Free(f);
}

static PyObject *Found_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *re, *text, *spans;
    if (!PyArg_ParseTuple(args, "OOO!:Found", &re, &text, &PyTuple_Type, &spans)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(spans);
    if (n < 2 || n % 2) {
        PyErr_SetString(PyExc_ValueError, "spans: a start and an end for the match and each group");
        return NULL;
    }
    PyObject *block = PyObject_GetAttrString(text, "block");
    if (!block) return NULL;
    Py_ssize_t *v = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    Found *f = NULL;
    if (!v) {
        PyErr_NoMemory();
    } else {
        int ok = 1;
        for (Py_ssize_t i = 0; ok && i < n; i++) ok = (v[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(spans, i))) != -1 || !PyErr_Occurred();
        if (ok) f = found_new(re, text, block, v, n);
    }
    PyMem_Free(v);
    Py_DECREF(block);
    return (PyObject *)f;
}

/* the number of group `g` (an int, or a name of the pattern), or -1 with IndexError */
static Py_ssize_t found_index(Found *f, PyObject *g) {
    Py_ssize_t i = -1;
    if (PyLong_Check(g)) {
        i = PyLong_AsSsize_t(g);
        if (i == -1 && PyErr_Occurred()) PyErr_Clear();
    } else if (PyUnicode_Check(g)) {
        PyObject *names = PyObject_GetAttrString(f->re, "groupindex");
        PyObject *at = names ? PyObject_GetItem(names, g) : NULL;
        Py_XDECREF(names);
        if (at) {
            i = PyLong_AsSsize_t(at);
            Py_DECREF(at);
        }
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
            PyErr_Clear();
            i = -1;
        }
    }
    if (i < 0 || i >= Py_SIZE(f) / 2) {
        PyErr_SetString(PyExc_IndexError, "no such group");
        return -1;
    }
    return i;
}

/* the text of group i, or `dflt` where it took no part */
static PyObject *found_text(Found *f, Py_ssize_t i, PyObject *dflt) {
    Py_ssize_t a = f->spans[2 * i], b = f->spans[2 * i + 1];
    if (a < 0) return Py_NewRef(dflt);
    Py_buffer v;
    if (PyObject_GetBuffer(f->block, &v, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = b <= v.len && a <= b ? PyUnicode_DecodeASCII((const char *)v.buf + a, b - a, NULL) : NULL;
    if (!out && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the block of this match has been refilled");
    PyBuffer_Release(&v);
    return out;
}

static PyObject *found_group(Found *f, PyObject *g) {
    Py_ssize_t i = found_index(f, g);
    return i < 0 ? NULL : found_text(f, i, Py_None);
}

static PyObject *Found_group(Found *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 0) return found_text(f, 0, Py_None);
    if (nargs == 1) return found_group(f, args[0]);
    PyObject *out = PyTuple_New(nargs);
    for (Py_ssize_t k = 0; out && k < nargs; k++) {
        PyObject *t = found_group(f, args[k]);
        if (!t) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *Found_groups(Found *f, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"default", NULL};
    PyObject *dflt = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:groups", kwlist, &dflt)) return NULL;
    Py_ssize_t n = Py_SIZE(f) / 2 - 1;
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        PyObject *t = found_text(f, k + 1, dflt);
        if (!t) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *Found_groupdict(Found *f, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"default", NULL};
    PyObject *dflt = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:groupdict", kwlist, &dflt)) return NULL;
    PyObject *names = PyObject_GetAttrString(f->re, "groupindex");
    PyObject *items = names ? PyMapping_Items(names) : NULL;
    Py_XDECREF(names);
    PyObject *out = items ? PyDict_New() : NULL;
    for (Py_ssize_t k = 0; out && k < PyList_GET_SIZE(items); k++) {
        PyObject *item = PyList_GET_ITEM(items, k);
        Py_ssize_t i = found_index(f, PyTuple_GET_ITEM(item, 0));
        PyObject *t = i < 0 ? NULL : found_text(f, i, dflt);
        if (!t || PyDict_SetItem(out, PyTuple_GET_ITEM(item, 0), t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
    Py_XDECREF(items);
    return out;
}

/* start(g=0), end(g=0), span(g=0): `which` 0, 1, 2 */
static PyObject *found_place(Found *f, PyObject *const *args, Py_ssize_t nargs, int which, const char *name) {
    if (nargs > 1) return PyErr_Format(PyExc_TypeError, "%s expected at most 1 argument", name);
    Py_ssize_t i = 0;
    if (nargs == 1 && (i = found_index(f, args[0])) < 0) return NULL;
    Py_ssize_t a = f->spans[2 * i], b = f->spans[2 * i + 1];
    return which == 0 ? PyLong_FromSsize_t(a) : which == 1 ? PyLong_FromSsize_t(b) : Py_BuildValue("(nn)", a, b);
}

static PyObject *Found_start(Found *f, PyObject *const *a, Py_ssize_t n) { return found_place(f, a, n, 0, "start"); }
static PyObject *Found_end(Found *f, PyObject *const *a, Py_ssize_t n) { return found_place(f, a, n, 1, "end"); }
static PyObject *Found_span(Found *f, PyObject *const *a, Py_ssize_t n) { return found_place(f, a, n, 2, "span"); }
static PyObject *Found_getitem(Found *f, PyObject *g) { return found_group(f, g); }
static PyObject *Found_string(Found *f, void *closure) { return PyObject_CallMethod(f->text, "get", NULL); }
static PyObject *Found_re(Found *f, void *closure) { return Py_NewRef(f->re); }

static PyMethodDef Found_methods[] = {
    {"group", (PyCFunction)(void (*)(void))Found_group, METH_FASTCALL, "group([g, ...]) -> text of the group(s)"},
    {"groups", (PyCFunction)(void (*)(void))Found_groups, METH_VARARGS | METH_KEYWORDS, "groups(default=None)"},
    {"groupdict", (PyCFunction)(void (*)(void))Found_groupdict, METH_VARARGS | METH_KEYWORDS,
     "groupdict(default=None)"},
    {"start", (PyCFunction)(void (*)(void))Found_start, METH_FASTCALL, "start(g=0)"},
    {"end", (PyCFunction)(void (*)(void))Found_end, METH_FASTCALL, "end(g=0)"},
    {"span", (PyCFunction)(void (*)(void))Found_span, METH_FASTCALL, "span(g=0)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Found_getset[] = {
    {"string", (getter)Found_string, NULL, "the decoded block the match was found in", NULL},
    {"re", (getter)Found_re, NULL, "the pattern", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMappingMethods Found_mapping = {.mp_subscript = (binaryfunc)Found_getitem};

static PyTypeObject FoundType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "repro.parsers._scan.Found",
    .tp_basicsize = offsetof(Found, spans),
    .tp_itemsize = sizeof(Py_ssize_t),
    .tp_dealloc = (destructor)Found_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A match found by the native scan, read as a re.Match.",
    .tp_methods = Found_methods,
    .tp_getset = Found_getset,
    .tp_as_mapping = &Found_mapping,
    .tp_new = Found_new,
};

/* the hits in file order as a list of (start, rule, line, match), or of (line, spans) when no
 * `patterns` are given (`bare`); a match is a Found of patterns[rule] over `text` and `block`,
 * or with `patterns` None a spans tuple; lines are 1-based, `base` lines before the block */
static PyObject *hits_list(Hits *h, const char *buf, size_t len, long long base, int bare, PyObject *patterns,
                           PyObject *text, PyObject *block) {
    qsort(h->items, h->n, sizeof(Hit), hit_order);
    PyObject *out = PyList_New((Py_ssize_t)h->n);
    int64_t line = base + 1;
    size_t counted = 0;
    for (size_t i = 0; out && i < h->n; i++) {
        Hit *hit = &h->items[i];
        line += count_newlines_in(buf + counted, buf + hit->start, buf + len);
        counted = hit->start;
        const Py_ssize_t *sp = h->pool + hit->at;
        PyObject *m;
        if (patterns) {
            m = (PyObject *)found_new(PyTuple_GET_ITEM(patterns, hit->rule), text, block, sp, (Py_ssize_t)hit->n);
        } else {
            m = PyTuple_New((Py_ssize_t)hit->n);
            for (size_t k = 0; m && k < hit->n; k++) {
                PyObject *v = PyLong_FromSsize_t(sp[k]);
                if (!v) Py_CLEAR(m);
                else PyTuple_SET_ITEM(m, (Py_ssize_t)k, v);
            }
        }
        PyObject *item = !m ? NULL
                         : bare ? Py_BuildValue("(LN)", (long long)line, m)
                                : Py_BuildValue("(niLN)", (Py_ssize_t)hit->start, hit->rule, (long long)line, m);
        if (!item) Py_CLEAR(out);
        else PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}

/* Scanner.matches(block, base): every successive match as (line, (start0, end0, start1, ...)) */
static PyObject *Scanner_matches(Scanner *self, PyObject *args) {
    Py_buffer blk;
    long long base;
    if (!PyArg_ParseTuple(args, "y*L", &blk, &base)) return NULL;
    Hits hits = {0};
    int status = collect(self, blk.buf, (size_t)blk.len, 0, &hits);
    PyObject *out = status < 0 ? NULL : status ? Py_NewRef(Py_None) : hits_list(&hits, blk.buf, (size_t)blk.len, base, 1, NULL, NULL, NULL);
    hits_free(&hits);
    PyBuffer_Release(&blk);
    return out;
}

static PyObject *Scanner_get_jit(Scanner *self, void *closure) { return PyBool_FromLong(self->any.jit); }

static PyMethodDef Scanner_methods[] = {
    {"records", (PyCFunction)Scanner_records, METH_VARARGS,
     "records(block, base, value, iteration, epoch) -> (lines, values, iterations, epochs, newlines) or None"},
    {"matches", (PyCFunction)Scanner_matches, METH_VARARGS,
     "matches(block, base) -> list of (line, spans of the match and its groups), or None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"jit", (getter)Scanner_get_jit, NULL, "whether PCRE2 compiled the pattern to machine code", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "repro.parsers._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A regular expression compiled by PCRE2 (JIT) for scanning blocks of log bytes.",
    .tp_methods = Scanner_methods,
    .tp_getset = Scanner_getset,
    .tp_init = (initproc)Scanner_init,
    .tp_new = PyType_GenericNew,
};

static int is_ascii(const char *p, const char *end) {
#ifdef __SSE2__
    for (; end - p >= 64; p += 64) {
        __m128i any = _mm_or_si128(_mm_or_si128(_mm_loadu_si128((const __m128i *)p), _mm_loadu_si128((const __m128i *)(p + 16))),
                                   _mm_or_si128(_mm_loadu_si128((const __m128i *)(p + 32)), _mm_loadu_si128((const __m128i *)(p + 48))));
        if (_mm_movemask_epi8(any)) return 0;
    }
#endif
    for (; p < end; p++)
        if (*p & 0x80) return 0;
    return 1;
}

/* ---- the start texts of several rules in one pass -----------------------------------------------
 * A block's non-record rules are mostly tried where one of their start texts occurs ("PARAMETER ",
 * "Arch :", "'dtype': "): a search of its own for each text read the block once a rule (ten rules
 * for PaddleClas logs). Here one pass finds the places of all of them: the first FP bytes of each
 * text are its fingerprint, and for each of those bytes two 16-entry tables, indexed by the low
 * and the high four bits of the byte, give the set of texts (up to 8 groups of them) that may have
 * that byte there. Two table lookups (pshufb) a byte and an AND across the FP bytes leave, for
 * each of 32 places at a time, the groups whose fingerprint is there; those places alone are
 * compared with the texts of those groups, and the rules of a text found are tried there, anchored,
 * each in file order from the end of its last match on: the same matches as collect() finds rule
 * by rule (a rule's match can only start where one of its texts does). */
#define MULTI_TEXTS 32 /* more start texts than this: each rule searches for its own */
#define MULTI_RULES 64
#define MULTI_MIN 4 /* fewer texts are found faster each by its own search (two bytes compared a place) */

#ifdef HAVE_AVX2_PATH
typedef struct {
    const char *s;
    size_t n;
    uint64_t rules; /* the rules that start with it */
} StartText;

typedef struct {
    StartText texts[MULTI_TEXTS];
    int ntexts, fp;                    /* fp: fingerprint bytes, 1 to 3 */
    uint8_t in_group[8][MULTI_TEXTS];  /* the texts of each group */
    int group_n[8];
    uint8_t lo[3][16], hi[3][16];      /* groups that may have a byte with these low / high bits */
} StartSet;

/* the rules whose start texts the block holds at `at` (of the groups in `groups`) */
static inline uint64_t texts_at(const StartSet *ss, const char *at, const char *end, unsigned groups) {
    uint64_t rules = 0;
    for (; groups; groups &= groups - 1) {
        int g = __builtin_ctz(groups);
        for (int k = 0; k < ss->group_n[g]; k++) {
            const StartText *t = &ss->texts[ss->in_group[g][k]];
            if ((size_t)(end - at) >= t->n && !memcmp(at, t->s, t->n)) rules |= t->rules;
        }
    }
    return rules;
}

/* the start texts of the scanners that have some (a text several rules start with, once), each
 * in the group with the fewest texts so far; 0 when they are too many, or too few for one pass to
 * pay (MULTI_MIN; or fewer than two scanners have any) */
static int start_set(StartSet *ss, Scanner **scanners, int n) {
    int with = 0;
    ss->ntexts = 0;
    ss->fp = 3;
    if (n > MULTI_RULES) return 0;
    for (int r = 0; r < n; r++) {
        Scanner *s = scanners[r];
        with += s->nstarts > 0;
        for (int j = 0; j < s->nstarts; j++) {
            const char *text = s->starts[j].text;
            size_t len = s->starts[j].nd.n;
            int k = 0;
            while (k < ss->ntexts && (ss->texts[k].n != len || memcmp(ss->texts[k].s, text, len))) k++;
            if (k == ss->ntexts) {
                if (k == MULTI_TEXTS || len == 0) return 0;
                ss->texts[ss->ntexts++] = (StartText){text, len, 0};
                if ((int)len < ss->fp) ss->fp = (int)len;
            }
            ss->texts[k].rules |= 1ULL << r;
        }
    }
    if (with < 2 || ss->ntexts < MULTI_MIN) return 0;
    memset(ss->group_n, 0, sizeof ss->group_n);
    memset(ss->lo, 0, sizeof ss->lo);
    memset(ss->hi, 0, sizeof ss->hi);
    for (int k = 0; k < ss->ntexts; k++) {
        int g = 0;
        for (int b = 1; b < 8; b++)
            if (ss->group_n[b] < ss->group_n[g]) g = b;
        ss->in_group[g][ss->group_n[g]++] = (uint8_t)k;
        for (int j = 0; j < ss->fp; j++) {
            unsigned char c = (unsigned char)ss->texts[k].s[j];
            ss->lo[j][c & 15] |= (uint8_t)(1u << g);
            ss->hi[j][c >> 4] |= (uint8_t)(1u << g);
        }
    }
    return 1;
}

typedef struct {
    Scanner **scanners;
    const char *buf;
    size_t len;
    size_t off[MULTI_RULES];   /* where each rule's next match may start */
    uint32_t groups[MULTI_RULES];
    pcre2_match_data *md;
    Hits *hits;
    int status;                /* 1: Python decides (a limit, an empty match); -1: error */
} MultiScan;

/* try the rules in `rules` (ascending: the order of hits at one place) anchored at `at` */
static int multi_try(MultiScan *m, const char *at, uint64_t rules) {
    size_t pos = (size_t)(at - m->buf);
    for (; rules; rules &= rules - 1) {
        int r = __builtin_ctzll(rules);
        if (pos < m->off[r]) continue;
        int rc = run(&m->scanners[r]->anchored, m->buf, m->len, pos, m->md);
        if (rc == PCRE2_ERROR_NOMATCH) continue;
        if ((m->status = keep_match(m->hits, r, rc, m->md, m->groups[r], &m->off[r])) != 0) return m->status;
    }
    return 0;
}

/* the groups whose fingerprints are at each of the 32 places from p (a byte each, 0: none) */
__attribute__((target("avx2"))) static inline __m256i groups_at(const StartSet *ss, const __m256i *lo,
                                                               const __m256i *hi, const char *p) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i acc = _mm256_set1_epi8((char)0xff);
    for (int j = 0; j < ss->fp; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + j));
        __m256i l = _mm256_shuffle_epi8(lo[j], _mm256_and_si256(v, nib));
        __m256i h = _mm256_shuffle_epi8(hi[j], _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        acc = _mm256_and_si256(acc, _mm256_and_si256(l, h));
    }
    return acc;
}

/* the places of the start texts in the block, in order: multi_try() at each */
__attribute__((target("avx2"))) static void starts_each(const StartSet *ss, MultiScan *m) {
    __m256i lo[3], hi[3];
    for (int j = 0; j < ss->fp; j++) {
        lo[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ss->lo[j]));
        hi[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ss->hi[j]));
    }
    const char *end = m->buf + m->len, *p = m->buf;
    uint8_t groups[32];
    for (; end - p >= 32 + ss->fp - 1; p += 32) {
        __m256i g = groups_at(ss, lo, hi, p);
        if (_mm256_testz_si256(g, g)) continue;
        unsigned mask = ~(unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(g, _mm256_setzero_si256()));
        _mm256_storeu_si256((__m256i *)groups, g);
        for (; mask; mask &= mask - 1) {
            int i = __builtin_ctz(mask);
            uint64_t rules = texts_at(ss, p + i, end, groups[i]);
            if (rules && multi_try(m, p + i, rules)) return;
        }
    }
    for (; p < end; p++) { /* the last places: every text compared */
        uint64_t rules = texts_at(ss, p, end, 0xff);
        if (rules && multi_try(m, p, rules)) return;
    }
}
#endif

/* the matches of every scanner with start texts, in one pass (see StartSet): 0, 1 where Python
 * must decide, -1 on an error; *done: whether it found those scanners' matches (else collect()
 * must, rule by rule) */
static int collect_started(Scanner **scanners, int n, const char *buf, size_t len, Hits *hits, int *done) {
    *done = 0;
#ifdef HAVE_AVX2_PATH
    StartSet ss;
    if (!have_avx2 || !start_set(&ss, scanners, n)) return 0;
    MultiScan m = {.scanners = scanners, .buf = buf, .len = len, .hits = hits};
    uint32_t most = 0;
    for (int r = 0; r < n; r++) {
        pcre2_pattern_info(scanners[r]->any.code, PCRE2_INFO_CAPTURECOUNT, &m.groups[r]);
        if (m.groups[r] > most) most = m.groups[r];
    }
    if (!(m.md = pcre2_match_data_create(most + 1, NULL))) {
        PyErr_NoMemory();
        return -1;
    }
    starts_each(&ss, &m);
    pcre2_match_data_free(m.md);
    *done = 1;
    return m.status;
#else
    return 0;
#endif
}

/* scan(scanners, block, base, patterns=None, text=None) -> list[(start, rule, line, match)] | None:
 * the matches of all the scanners in an ASCII block, in file order (ties by their place in
 * `scanners`), each with its 1-based line (`base` lines before the block); a match is a Found of
 * patterns[rule] (the re.Pattern of each scanner) over `text` (the block's _Text), or without
 * them its spans as Scanner.matches gives them; None when the block is not ASCII or a scanner
 * leaves its matches to Python */
static PyObject *scan_scan(PyObject *mod, PyObject *args) {
    PyObject *scanners, *patterns = Py_None, *text = Py_None;
    Py_buffer blk;
    long long base;
    if (!PyArg_ParseTuple(args, "O!y*L|OO", &PyTuple_Type, &scanners, &blk, &base, &patterns, &text)) return NULL;
    if (patterns != Py_None && (!PyTuple_Check(patterns) || PyTuple_GET_SIZE(patterns) != PyTuple_GET_SIZE(scanners))) {
        PyBuffer_Release(&blk);
        PyErr_SetString(PyExc_TypeError, "scan() takes a pattern for each scanner");
        return NULL;
    }
    const char *buf = blk.buf;
    size_t len = (size_t)blk.len;
    Hits hits = {0};
    Py_ssize_t n = PyTuple_GET_SIZE(scanners);
    int status = 0, started = 0;
    for (Py_ssize_t i = 0; !status && i < n; i++) {
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(scanners, i), &ScannerType)) {
            PyErr_SetString(PyExc_TypeError, "scan() takes a tuple of Scanner objects");
            status = -1;
        }
    }
    if (!status) status = is_ascii(buf, buf + len) ? 0 : 1;
    if (!status && n <= MULTI_RULES)
        status = collect_started((Scanner **)&PyTuple_GET_ITEM(scanners, 0), (int)n, buf, len, &hits, &started);
    for (Py_ssize_t i = 0; !status && i < n; i++) {
        Scanner *s = (Scanner *)PyTuple_GET_ITEM(scanners, i);
        if (!started || !s->nstarts) status = collect(s, buf, len, (int)i, &hits);
    }
    PyObject *out = status < 0 ? NULL
                    : status   ? Py_NewRef(Py_None)
                               : hits_list(&hits, buf, len, base, 0, patterns == Py_None ? NULL : patterns, text, blk.obj);
    hits_free(&hits);
    PyBuffer_Release(&blk);
    return out;
}

/* ---- DLLogger PARAMETER lines ----------------------------------------------------------------
 * The value of a key in "key : value  key : value" (items
 * split on two spaces, each stripped, then split at its first " : "; the last item with the
 * key wins), found without splitting the line: the last "key :" that opens an item. The same
 * answer as repro.parsers.base.Params._search, for ASCII text and keys. */
static inline int py_space(unsigned char c) { /* str.isspace() for ASCII */
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* the value of `key` (kn bytes) in the line t (n bytes), as a new str; None when absent; NULL: error */
static PyObject *param_value(const char *t, Py_ssize_t n, const char *k, Py_ssize_t kn) {
    if (kn == 0 || py_space((unsigned char)k[0])) Py_RETURN_NONE;
    char small[64], *needle = kn + 2 <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)kn + 2);
    if (!needle) return PyErr_NoMemory();
    memcpy(needle, k, (size_t)kn);
    needle[kn] = ' ';
    needle[kn + 1] = ':';
    Needle nd;
    needle_init(&nd, needle, (size_t)kn + 2);
    const char *value = NULL; /* of the last "key :" that opens an item */
    Py_ssize_t value_len = 0;
    for (const char *p = t; (p = needle_find(&nd, p, t + n)) != NULL; p++) {
        Py_ssize_t at = p - t, start = at; /* back over the blanks before the key */
        while (start && py_space((unsigned char)t[start - 1])) start--;
        int opens = start == 0;
        for (Py_ssize_t i = start; !opens && i + 1 < at; i++) opens = t[i] == ' ' && t[i + 1] == ' ';
        if (!opens) continue;
        const char *stop = find_bytes(p, t + n, "  ", 2);
        Py_ssize_t item_end = stop ? stop - t : n;
        while (item_end > at && py_space((unsigned char)t[item_end - 1])) item_end--;
        Py_ssize_t after = at + kn; /* just past the key */
        if (item_end - after >= 3 && t[after] == ' ' && t[after + 1] == ':' && t[after + 2] == ' ') {
            Py_ssize_t a = after + 3;
            while (a < item_end && py_space((unsigned char)t[a])) a++;
            value = t + a;
            value_len = item_end - a;
        } else if (item_end - after == 2) { /* "key :" */
            value = t + after;
            value_len = 0;
        }
    }
    if (needle != small) PyMem_Free(needle);
    if (!value) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize(value, value_len);
}

/* param(text, keys) -> tuple[str | None, ...] | None: the value of each key (one call for all the
 * keys a handler reads); None when the text or a key is not ASCII (Python decides) */
static PyObject *scan_param(PyObject *mod, PyObject *args) {
    PyObject *text, *keys;
    if (!PyArg_ParseTuple(args, "UO!", &text, &PyTuple_Type, &keys)) return NULL;
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyUnicode_Check(key)) return PyErr_Format(PyExc_TypeError, "keys must be str");
        if (!PyUnicode_IS_ASCII(key)) Py_RETURN_NONE;
    }
    if (!PyUnicode_IS_ASCII(text)) Py_RETURN_NONE;
    const char *t = (const char *)PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyTuple_New(nkeys);
    for (Py_ssize_t i = 0; out && i < nkeys; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        PyObject *v = param_value(t, n, (const char *)PyUnicode_DATA(key), PyUnicode_GET_LENGTH(key));
        if (!v) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

/* contains(haystack, needle) -> bool: `needle in haystack` for bytes, by the literal search above,
 * several times faster than CPython's for the short needles the engine looks for in every block */
static PyObject *scan_contains(PyObject *mod, PyObject *args) {
    Py_buffer h, n;
    if (!PyArg_ParseTuple(args, "y*y*", &h, &n)) return NULL;
    int found = find_bytes(h.buf, (const char *)h.buf + h.len, n.buf, (size_t)n.len) != NULL;
    PyBuffer_Release(&h);
    PyBuffer_Release(&n);
    return PyBool_FromLong(found);
}

/* ---- MPI output tags --------------------------------------------------------------------------
 * misplaced_tag(block, stamped) -> bool: is there a "]<stdout>:" or "]<stderr>:" that does not
 * end a tag opening its line in the usual form, "[J,R]<std...>:" with 1-3 and 1-4 digits, after
 * the --timestamp-output stamp ("Mon Jun 13 17:45:27 2022") when `stamped`? The question
 * repro.parsers.base._misplaced_tag's expression asks with twelve lookbehinds, answered by
 * walking back from each tag end. */
static inline int upper(char c) { return c >= 'A' && c <= 'Z'; }
static inline int lower(char c) { return c >= 'a' && c <= 'z'; }

static int stamp_at(const char *p) { /* [A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4} */
    return p[3] == ' ' && p[7] == ' ' && p[10] == ' ' && p[13] == ':' && p[16] == ':' && p[19] == ' ' &&
           upper(p[0]) && lower(p[1]) && lower(p[2]) && upper(p[4]) && lower(p[5]) && lower(p[6]) &&
           (p[8] == ' ' || is_digit(p[8])) && is_digit(p[9]) && is_digit(p[11]) && is_digit(p[12]) &&
           is_digit(p[14]) && is_digit(p[15]) && is_digit(p[17]) && is_digit(p[18]) && is_digit(p[20]) &&
           is_digit(p[21]) && is_digit(p[22]) && is_digit(p[23]);
}

/* the start of the MPI tag "[J,R]<std...>:" whose "]" is at `q` (after the stamp when `stamped`),
 * or NULL; *jd and *rd: the number of digits of J and R */
static const char *tag_start(const char *buf, const char *q, int stamped, int *jd, int *rd) {
    int r = 0, j = 0;
    while (q > buf && is_digit(q[-1])) q--, r++;
    if (r < 1 || q == buf || *--q != ',') return NULL;
    while (q > buf && is_digit(q[-1])) q--, j++;
    if (j < 1 || q == buf || *--q != '[') return NULL;
    if (stamped) {
        if (q - buf < 24 || !stamp_at(q - 24)) return NULL;
        q -= 24;
    }
    *jd = j;
    *rd = r;
    return q;
}

/* the next "]<stdout>:" or "]<stderr>:" from p on (`it` finds "]<std"): the place of its "]", or NULL */
static const char *tag_end(NeedleIter *it, const char *p) {
    while ((p = needle_next(it, p)) != NULL) {
        if (it->end - p >= 10 && (!memcmp(p + 5, "out>:", 5) || !memcmp(p + 5, "err>:", 5))) return p;
        p += 5;
    }
    return NULL;
}

static PyObject *scan_misplaced_tag(PyObject *mod, PyObject *args) {
    Py_buffer blk;
    int stamped;
    if (!PyArg_ParseTuple(args, "y*p", &blk, &stamped)) return NULL;
    const char *buf = blk.buf, *end = buf + blk.len, *p = buf;
    int misplaced = 0, j, r;
    Needle tag;
    needle_init(&tag, "]<std", 5);
    NeedleIter it;
    needle_iter_init(&it, &tag, end);
    while (!misplaced && (p = tag_end(&it, p)) != NULL) {
        const char *q = tag_start(buf, p, stamped, &j, &r);
        misplaced = !q || j > 3 || r > 4 || (q != buf && q[-1] != '\n');
        p += 10;
    }
    PyBuffer_Release(&blk);
    return PyBool_FromLong(misplaced);
}

/* strip_tags(block, stamped, out=None) -> bytes | bytearray: the block without its MPI tags,
 * re.sub(b"", block) with repro.parsers.base._MPI_TAG_B (or _MPI_STAMPED_TAG_B when `stamped`),
 * found from each tag's end. With `out` (a bytearray, which may be the block itself) the result is
 * written into it and `out` returned: a caller that strips block after block reuses one buffer,
 * where a new megabyte a block costs a page fault every 4 KiB (more than the stripping). Text only
 * ever moves towards the start, behind every place still to be read, so `out` may be `block`. */
static PyObject *scan_strip_tags(PyObject *mod, PyObject *args) {
    Py_buffer blk;
    int stamped;
    PyObject *out = Py_None;
    if (!PyArg_ParseTuple(args, "y*p|O", &blk, &stamped, &out)) return NULL;
    if (out != Py_None && !PyByteArray_Check(out)) {
        PyBuffer_Release(&blk);
        PyErr_SetString(PyExc_TypeError, "strip_tags: out must be a bytearray");
        return NULL;
    }
    const char *buf = blk.buf, *end = buf + blk.len, *p = buf, *kept = buf;
    int same = out != Py_None && blk.obj == out;
    if (out == Py_None) {
        out = PyBytes_FromStringAndSize(NULL, blk.len);
    } else if (!same && PyByteArray_Resize(out, blk.len) < 0) {
        out = NULL;
    } else {
        Py_INCREF(out);
    }
    if (!out) {
        PyBuffer_Release(&blk);
        return NULL;
    }
    char *start = PyBytes_Check(out) ? PyBytes_AS_STRING(out) : PyByteArray_AS_STRING(out), *dst = start;
    int j, r;
    Needle tag;
    needle_init(&tag, "]<std", 5);
    NeedleIter it;
    needle_iter_init(&it, &tag, end);
    while ((p = tag_end(&it, p)) != NULL) {
        const char *q = tag_start(kept, p, stamped, &j, &r); /* not into what a tag before took */
        if (q) {
            memmove(dst, kept, (size_t)(q - kept));
            dst += q - kept;
            kept = p + 10;
        }
        p += 10;
    }
    memmove(dst, kept, (size_t)(end - kept));
    dst += end - kept;
    PyBuffer_Release(&blk);
    int rc = PyBytes_Check(out) ? _PyBytes_Resize(&out, dst - start) : PyByteArray_Resize(out, dst - start);
    return rc < 0 ? NULL : out;
}

/* value_range(doubles) -> (min, max) | None: min() and max() of a buffer of doubles, as Python's
 * builtins give them (the first value, replaced only by one strictly smaller / larger) */
static PyObject *scan_value_range(PyObject *mod, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    Py_ssize_t n = b.len / (Py_ssize_t)sizeof(double);
    PyObject *out;
    if (n == 0 || b.len % (Py_ssize_t)sizeof(double)) {
        out = Py_NewRef(Py_None);
    } else {
        const double *v = b.buf;
        double lo = v[0], hi = v[0];
        for (Py_ssize_t i = 1; i < n; i++) {
            if (v[i] < lo) lo = v[i];
            if (v[i] > hi) hi = v[i];
        }
        out = Py_BuildValue("(dd)", lo, hi);
    }
    PyBuffer_Release(&b);
    return out;
}

/* fsum(doubles) -> float | None: math.fsum() of a buffer of doubles, without a float object per
 * value. The same algorithm (exact partials, then the sum of the partials from the top with the
 * half-to-even correction across them), so the same result; None for an infinity, a NaN or an
 * intermediate overflow (math.fsum answers those). */
static PyObject *scan_fsum(PyObject *mod, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const double *v = b.buf;
    Py_ssize_t count = b.len / (Py_ssize_t)sizeof(double);
    double p[64]; /* partials, non-overlapping, by increasing magnitude (a double needs < 40) */
    int n = 0, decided = b.len % (Py_ssize_t)sizeof(double) == 0;
    for (Py_ssize_t k = 0; decided && k < count; k++) {
        double x = v[k];
        int i = 0;
        for (int j = 0; j < n; j++) {
            double y = p[j];
            if (fabs(x) < fabs(y)) {
                double t = x;
                x = y;
                y = t;
            }
            double hi = x + y, lo = y - (hi - x);
            if (lo != 0.0) p[i++] = lo;
            x = hi;
        }
        n = i;
        if (x != 0.0) {
            if (!isfinite(x) || n == 64) decided = 0; /* math.fsum decides */
            else p[n++] = x;
        }
    }
    PyBuffer_Release(&b);
    if (!decided) Py_RETURN_NONE;
    double hi = 0.0, lo = 0.0;
    if (n > 0) {
        hi = p[--n];
        while (n > 0) { /* from the top, until the sum is inexact */
            double x = hi, y = p[--n];
            hi = x + y;
            lo = y - (hi - x);
            if (lo != 0.0) break;
        }
        if (n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0))) {
            double y = lo * 2.0, x = hi + y; /* half to even across partials */
            if (y == x - hi) hi = x;
        }
    }
    return PyFloat_FromDouble(hi);
}

static PyMethodDef scan_functions[] = {
    {"misplaced_tag", scan_misplaced_tag, METH_VARARGS,
     "misplaced_tag(block, stamped) -> an MPI tag that does not open its line, or is not of the usual form"},
    {"scan", scan_scan, METH_VARARGS,
     "scan(scanners, block, base) -> every scanner's matches as (start, rule, line, spans), or None"},
    {"strip_tags", scan_strip_tags, METH_VARARGS,
     "strip_tags(block, stamped) -> the block without its MPI tags (optionally timestamped)"},
    {"fsum", scan_fsum, METH_VARARGS, "fsum(doubles) -> math.fsum of a buffer of doubles, or None"},
    {"value_range", scan_value_range, METH_VARARGS, "value_range(doubles) -> (min, max) or None when empty"},
    {"contains", scan_contains, METH_VARARGS, "contains(haystack, needle) -> needle in haystack (bytes)"},
    {"param", scan_param, METH_VARARGS,
     "param(text, keys) -> the value (or None) of each key in a DLLogger PARAMETER line; None if not ASCII"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "PCRE2 scanner for repro's log parsers.", -1, scan_functions,
};

PyMODINIT_FUNC PyInit__scan(void) {
    byte_ranks_init();
#ifdef HAVE_AVX2_PATH
    have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
#endif
    if (PyType_Ready(&ScannerType) < 0 || PyType_Ready(&FoundType) < 0) return NULL;
    PyObject *m = PyModule_Create(&scan_module);
    if (!m) return NULL;
    char version[64];
    pcre2_config(PCRE2_CONFIG_VERSION, version);
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0 ||
        PyModule_AddObjectRef(m, "Found", (PyObject *)&FoundType) < 0 ||
        PyModule_AddStringConstant(m, "PCRE2_VERSION", version) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
