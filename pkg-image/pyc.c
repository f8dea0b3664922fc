// SPDX-License-Identifier: MIT
/*
 * What a compiled Python module (a .pyc file) imports as its body runs:
 * the IMPORT_NAME and IMPORT_FROM instructions of its top-level code
 * object, with their level (`from . import`), in order. Fetch-ahead reads
 * them from each .pyc Python reads, so that the modules it imports next
 * are fetched before it asks (fetch_ahead.c, py_predict).
 *
 * Only the module body: imports inside functions run later or never
 * (numpy's and the standard library's are full of them), and a plain
 * scan of every name in the file also matched the variables and
 * attributes that share a module's name (os, types, string, code...).
 *
 * The file comes from an image: every length is checked against the
 * bytes that remain before it is used, nesting and the objects kept are
 * bounded, and anything this reader does not know (another Python
 * version, another object type) is "nothing to predict", never a guess.
 * Formats: CPython's marshal (Python/marshal.c) and the code object's
 * fields and opcodes of CPython 3.8 to 3.12.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PYC_HEADER 16      /* magic, flags, then mtime and size or a hash */
#define PYC_DEPTH_MAX 64   /* nested objects: a code object nests at 2 per level */
#define PYC_CONSTS_MAX 4096 /* the body's constants and names kept */
#define PYC_LEVEL_MAX 64
/* Back-references: numpy's largest .pyc (700 KB) has 3,723. */
#define PYC_REFS_MAX (1u << 16)

/* marshal's type codes, and the flag that adds the object to its refs */
enum {
	T_NULL = '0', T_NONE = 'N', T_FALSE = 'F', T_TRUE = 'T', T_STOPITER = 'S',
	T_ELLIPSIS = '.', T_INT = 'i', T_INT64 = 'I', T_FLOAT = 'f',
	T_BINARY_FLOAT = 'g', T_COMPLEX = 'x', T_BINARY_COMPLEX = 'y', T_LONG = 'l',
	T_STRING = 's', T_INTERNED = 't', T_REF = 'r', T_TUPLE = '(', T_LIST = '[',
	T_DICT = '{', T_CODE = 'c', T_UNICODE = 'u', T_SET = '<', T_FROZENSET = '>',
	T_ASCII = 'a', T_ASCII_INTERNED = 'A', T_SMALL_TUPLE = ')',
	T_SHORT_ASCII = 'z', T_SHORT_ASCII_INTERNED = 'Z',
	FLAG_REF = 0x80,
};

/* Opcodes of 3.8 to 3.12 (unchanged across them). */
enum {
	OP_LOAD_CONST = 100, OP_IMPORT_NAME = 108, OP_IMPORT_FROM = 109,
	OP_EXTENDED_ARG = 144,
};

/* What an object was, as far as imports need: an ASCII string, an int, bytes. */
enum { O_OTHER, O_NULL, O_STR, O_INT, O_BYTES };
struct pyc_obj {
	uint8_t kind;
	uint32_t len;       /* O_STR, O_BYTES */
	const uint8_t *p;   /* O_STR, O_BYTES: into the file */
	int32_t ival;       /* O_INT */
};

/* A tuple's items, kept (the body's constants and names). */
struct pyc_items {
	struct pyc_obj *v;
	uint32_t nr;
};

struct pyc_reader {
	const uint8_t *buf;
	size_t len, pos;
	unsigned int minor;           /* 3.minor */
	struct pyc_obj *refs;         /* marshal's back-references, in order */
	size_t nr_refs, refs_cap;
};

/*
 * The Python 3 minor version of a .pyc magic number: the releases' only
 * (their alphas and betas changed the code object and opcodes), or 0.
 */
static unsigned int pyc_minor(uint16_t magic)
{
	static const uint16_t magics[][2] = {
		{ 3413, 8 }, { 3425, 9 }, { 3439, 10 }, { 3495, 11 }, { 3531, 12 },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(magics); i++)
		if (magic == magics[i][0])
			return magics[i][1];
	return 0;
}

/* Take @n bytes: 0 and *@p, or 1 where the file ends first. */
static int take(struct pyc_reader *r, size_t n, const uint8_t **p)
{
	if (n > r->len - r->pos)
		return 1;
	*p = r->buf + r->pos;
	r->pos += n;
	return 0;
}

static int take_u8(struct pyc_reader *r, uint32_t *v)
{
	const uint8_t *p;

	if (take(r, 1, &p))
		return 1;
	*v = *p;
	return 0;
}

static int take_i32(struct pyc_reader *r, int32_t *v)
{
	const uint8_t *p;

	if (take(r, 4, &p))
		return 1;
	*v = (int32_t)get_le32(p);
	return 0;
}

/* A count or length of 0..the bytes left (each item takes one at least). */
static int take_count(struct pyc_reader *r, uint32_t *n)
{
	int32_t v;

	if (take_i32(r, &v) || v < 0 || (size_t)v > r->len - r->pos)
		return 1;
	*n = (uint32_t)v;
	return 0;
}

static int object(struct pyc_reader *r, unsigned int depth, struct pyc_obj *out,
		  struct pyc_items *keep);

/* @n objects (a tuple's, list's or set's items), kept in @keep if given. */
static int items(struct pyc_reader *r, unsigned int depth, uint32_t n,
		 struct pyc_items *keep)
{
	struct pyc_obj o;
	uint32_t i;
	int ret;

	if (keep) {
		keep->nr = 0;
		keep->v = malloc(MAX(MIN(n, (uint32_t)PYC_CONSTS_MAX), 1u) * sizeof(*keep->v));
		if (!keep->v)
			return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		ret = object(r, depth + 1, &o, NULL);
		if (ret)
			return ret;
		if (o.kind == O_NULL)
			return 1; /* only a dict's end */
		if (keep && i < PYC_CONSTS_MAX)
			keep->v[keep->nr++] = o;
	}
	return 0;
}

/*
 * A code object's fields after its type code. With @co (the module
 * body's): its code into *@co, its constants and names kept, and nothing
 * read after them.
 */
static int code(struct pyc_reader *r, unsigned int depth, struct pyc_obj *co,
		struct pyc_items *consts, struct pyc_items *names)
{
	/* 3.8-3.10: argcount, posonlyargcount, kwonlyargcount, nlocals,
	 * stacksize, flags; 3.11: no nlocals. Then code, consts, names, and
	 * varnames, freevars, cellvars, filename, name (3.8-3.10), or
	 * localsplusnames, localspluskinds, filename, name, qualname (3.11+);
	 * firstlineno; lnotab or linetable (and exceptiontable, 3.11+). */
	unsigned int nr_ints = r->minor >= 11 ? 5 : 6, nr_mid = 5;
	unsigned int nr_tail = r->minor >= 11 ? 2 : 1;
	struct pyc_obj o;
	const uint8_t *p;
	unsigned int i;
	int ret;

	if (take(r, 4 * nr_ints, &p))
		return 1;
	ret = object(r, depth + 1, co ? co : &o, NULL);
	if (!ret && co && co->kind != O_BYTES)
		ret = 1;
	if (!ret)
		ret = object(r, depth + 1, &o, consts);
	if (!ret)
		ret = object(r, depth + 1, &o, names);
	if (ret || co) /* the body: what imports need is read */
		return ret;
	for (i = 0; !ret && i < nr_mid; i++)
		ret = object(r, depth + 1, &o, NULL);
	if (!ret)
		ret = take(r, 4, &p);
	for (i = 0; !ret && i < nr_tail; i++)
		ret = object(r, depth + 1, &o, NULL);
	return ret;
}

/*
 * One object: 0 and what it was in *@out, 1 where the file is not what
 * marshal writes (or nests deeper than PYC_DEPTH_MAX), or -ENOMEM. With
 * @keep, a tuple's items are kept there (the caller frees keep->v).
 */
static int object(struct pyc_reader *r, unsigned int depth, struct pyc_obj *out,
		  struct pyc_items *keep)
{
	uint32_t type, n, ref = 0;
	const uint8_t *p;
	struct pyc_obj o;
	int32_t v;
	bool flag;
	int ret = 0;

	*out = (struct pyc_obj){ .kind = O_OTHER };
	if (depth > PYC_DEPTH_MAX || take_u8(r, &type))
		return 1;
	flag = type & FLAG_REF;
	type &= ~(uint32_t)FLAG_REF;
	if (flag) { /* its place in refs is taken before its items are read */
		if (r->nr_refs == PYC_REFS_MAX)
			return 1;
		if (array_reserve(&r->refs, &r->refs_cap, r->nr_refs + 1,
				  sizeof(*r->refs), 256))
			return -ENOMEM;
		ref = (uint32_t)r->nr_refs++;
		r->refs[ref] = *out;
	}
	switch (type) {
	case T_NULL:
		out->kind = O_NULL;
		break;
	case T_NONE: case T_FALSE: case T_TRUE: case T_STOPITER: case T_ELLIPSIS:
		break;
	case T_INT:
		ret = take_i32(r, &v);
		if (!ret)
			*out = (struct pyc_obj){ .kind = O_INT, .ival = v };
		break;
	case T_INT64: case T_BINARY_FLOAT:
		ret = take(r, 8, &p);
		break;
	case T_BINARY_COMPLEX:
		ret = take(r, 16, &p);
		break;
	case T_FLOAT:
		ret = take_u8(r, &n) || take(r, n, &p);
		break;
	case T_COMPLEX:
		ret = take_u8(r, &n) || take(r, n, &p) || take_u8(r, &n) || take(r, n, &p);
		break;
	case T_LONG: /* a signed count of 15-bit digits, 2 bytes each */
		ret = take_i32(r, &v) || v == INT32_MIN ||
		      take(r, 2 * (size_t)(v < 0 ? -(int64_t)v : v), &p);
		break;
	case T_STRING: case T_INTERNED: case T_UNICODE: case T_ASCII: case T_ASCII_INTERNED:
		ret = take_count(r, &n) || take(r, n, &p);
		if (!ret)
			*out = (struct pyc_obj){
				.kind = type == T_STRING ? O_BYTES :
					type == T_ASCII || type == T_ASCII_INTERNED ? O_STR : O_OTHER,
				.p = p, .len = n,
			};
		break;
	case T_SHORT_ASCII: case T_SHORT_ASCII_INTERNED:
		ret = take_u8(r, &n) || take(r, n, &p);
		if (!ret)
			*out = (struct pyc_obj){ .kind = O_STR, .p = p, .len = n };
		break;
	case T_REF:
		ret = take_i32(r, &v);
		if (!ret && (v < 0 || (size_t)v >= r->nr_refs))
			ret = 1;
		if (!ret)
			*out = r->refs[v];
		break;
	case T_SMALL_TUPLE:
		ret = take_u8(r, &n);
		if (!ret)
			ret = items(r, depth, n, keep);
		break;
	case T_TUPLE: case T_LIST: case T_SET: case T_FROZENSET:
		ret = take_count(r, &n);
		if (!ret)
			ret = items(r, depth, n, type == T_TUPLE ? keep : NULL);
		break;
	case T_DICT: /* key, value pairs up to a NULL key */
		do {
			ret = object(r, depth + 1, &o, NULL);
			if (!ret && o.kind != O_NULL)
				ret = object(r, depth + 1, &o, NULL);
		} while (!ret && o.kind != O_NULL);
		break;
	case T_CODE:
		ret = code(r, depth, NULL, NULL, NULL);
		break;
	default: /* TYPE_UNKNOWN, or a type of another version */
		ret = 1;
		break;
	}
	if (!ret && flag)
		r->refs[ref] = *out;
	return ret;
}

/* A module name: identifiers joined by single dots; empty only for @rel. */
static bool module_name(const uint8_t *p, uint32_t len, bool dots)
{
	uint32_t i;
	bool start = true;

	if (len > PYC_NAME_MAX)
		return false;
	for (i = 0; i < len; i++) {
		uint8_t c = p[i];

		if (c == '.' && dots && !start && i + 1 < len) {
			start = true;
			continue;
		}
		if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (!start && c >= '0' && c <= '9')))
			return false;
		start = false;
	}
	return true;
}

/*
 * The body's IMPORT_NAME (name, and level from the LOAD_CONST two
 * instructions before it) and IMPORT_FROM (name) instructions.
 */
static unsigned int scan_code(const struct pyc_obj *co, const struct pyc_items *consts,
			      const struct pyc_items *names, struct pyc_import *out,
			      unsigned int max)
{
	int64_t c1 = -1, c2 = -1; /* the last two instructions' LOAD_CONST args */
	struct pyc_import cur = { 0 };
	bool have_cur = false;
	uint32_t i, ext = 0, arg;
	unsigned int nr = 0;

	for (i = 0; i + 1 < co->len && nr < max; i += 2) {
		uint8_t op = co->p[i];
		const struct pyc_obj *s;

		arg = ext | co->p[i + 1];
		if (op == OP_EXTENDED_ARG) {
			ext = arg << 8 & 0xffffff00u;
			continue;
		}
		ext = 0;
		if (op == 0) /* 3.11+: an instruction's inline cache */
			continue;
		if (op != OP_IMPORT_NAME && op != OP_IMPORT_FROM) {
			c2 = c1;
			c1 = op == OP_LOAD_CONST ? (int64_t)arg : -1;
			continue;
		}
		s = arg < names->nr && names->v[arg].kind == O_STR ? &names->v[arg] : NULL;
		if (op == OP_IMPORT_NAME) {
			const struct pyc_obj *l = c2 >= 0 && c2 < consts->nr ? &consts->v[c2] : NULL;

			have_cur = s && l && l->kind == O_INT && l->ival >= 0 &&
				   l->ival <= PYC_LEVEL_MAX &&
				   (s->len || l->ival) && module_name(s->p, s->len, true);
			if (have_cur) {
				cur = (struct pyc_import){
					.name = (const char *)s->p, .name_len = (uint8_t)s->len,
					.level = (uint8_t)l->ival,
				};
				out[nr++] = cur;
			}
		} else if (have_cur && s && s->len && module_name(s->p, s->len, false)) {
			out[nr] = cur;
			out[nr].from = (const char *)s->p;
			out[nr++].from_len = (uint8_t)s->len;
		}
		c1 = c2 = -1;
	}
	return nr;
}

int pyc_imports(const uint8_t *buf, size_t len, struct pyc_import *out,
		unsigned int max)
{
	struct pyc_reader r = { .buf = buf, .len = len, .pos = PYC_HEADER };
	struct pyc_items consts = { 0 }, names = { 0 };
	struct pyc_obj co;
	uint32_t type;
	int ret;

	if (len < PYC_HEADER || buf[2] != '\r' || buf[3] != '\n')
		return 0;
	r.minor = pyc_minor(get_le16(buf));
	if (!r.minor)
		return 0;
	ret = take_u8(&r, &type);
	if (ret || (type & ~(uint32_t)FLAG_REF) != T_CODE)
		return 0;
	if (type & FLAG_REF) { /* the body is refs[0] */
		if (array_reserve(&r.refs, &r.refs_cap, 1, sizeof(*r.refs), 256))
			return -ENOMEM;
		r.refs[r.nr_refs++] = (struct pyc_obj){ .kind = O_OTHER };
	}
	ret = code(&r, 0, &co, &consts, &names);
	if (!ret)
		ret = (int)scan_code(&co, &consts, &names, out, max);
	else if (ret > 0)
		ret = 0;
	free(consts.v);
	free(names.v);
	free(r.refs);
	return ret;
}
