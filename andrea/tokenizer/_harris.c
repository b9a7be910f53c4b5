/* The Harris tokenizer's inner loop in C: cutting text into words and looking each word up.

   split(text) is re.findall(WORD_PATTERN, text) for the tokenizer's one pattern,

       '(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s+

   with the character classes Python's re gives a str pattern: \s is str.isspace, \d is
   str.isdecimal, \w is str.isalnum or '_'. trie(segments, first_id) holds the segments (ids
   first_id, first_id + 1, ...) in a trie, and set_id(trie, segment, id) changes one (-1 takes it
   out, as training's pruning does); encode_word(trie, word, marked) is step 2 of the encoding
   rule, the longest segment at each position, else the UTF-8 bytes of one character
   ('surrogatepass' for a lone surrogate). A word end (" cat</w>") is held as its text followed by
   the character 0; where `marked` is true, a match that reaches the end of the word may take that
   one more step, and a plain segment may not end the word. encode marks a letter word (its last
   character a letter, its first not an apostrophe) when the trie holds a word end. encode(text, cache, out, trie, limit) appends to the list `out` the ids
   of every word of text, read from `cache`, a dict of word -> tuple of ids, where a word it has
   not seen is encoded and added (the cache is emptied first when it holds `limit` words).
   andrea/tokenizer/harris.py holds the same steps in Python, which is what runs where this module was
   not built, and what the tests hold this module to. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { LETTER, DIGIT, UNDERSCORE, SPACE, PUNCT };

/* Before Python 3.12 a str may be held in a legacy form that must be made ready to be read. */
static inline int ready(PyObject *s)
{
#if PY_VERSION_HEX < 0x030C0000
    return PyUnicode_READY(s);
#else
    (void)s;
    return 0;
#endif
}

static unsigned char ascii_class[128];

static inline int char_class(Py_UCS4 c)
{
    if (c < 128)
        return ascii_class[c];
    if (Py_UNICODE_ISSPACE(c))
        return SPACE;
    if (Py_UNICODE_ISDECIMAL(c))
        return DIGIT;
    if (Py_UNICODE_ISALNUM(c))
        return LETTER;
    return PUNCT;
}

/* The end of the word that starts at i (i < n): the first alternative of the pattern that
   matches there, as re tries them. */
static Py_ssize_t word_end(int kind, const void *data, Py_ssize_t i, Py_ssize_t n)
{
    Py_UCS4 c = PyUnicode_READ(kind, data, i);
    if (c == '\'' && i + 1 < n) { /* '(?:[sdmt]|ll|ve|re) */
        Py_UCS4 d = PyUnicode_READ(kind, data, i + 1);
        if (d == 's' || d == 'd' || d == 'm' || d == 't')
            return i + 2;
        if (i + 2 < n) {
            Py_UCS4 e = PyUnicode_READ(kind, data, i + 2);
            if ((d == 'l' && e == 'l') || (d == 'v' && e == 'e') || (d == 'r' && e == 'e'))
                return i + 3;
        }
    }
    int cls = char_class(c);
    Py_ssize_t j = i + 1;
    if (c == ' ' && j < n) { /* the optional space before letters, digits or other signs */
        int next = char_class(PyUnicode_READ(kind, data, j));
        if (next == LETTER || next == DIGIT || next == PUNCT) {
            cls = next;
            j++;
        }
    }
    while (j < n && char_class(PyUnicode_READ(kind, data, j)) == cls)
        j++;
    if (cls != SPACE)
        return j; /* ' ?[^\W\d_]+', ' ?\d+', ' ?[^\s\w]+' or '_+' */
    if (j == n)
        return j; /* \s+(?!\S) at the end of the text */
    if (j - i >= 2)
        return j - 1; /* \s+(?!\S): the last space stays for the word after it */
    return j;         /* \s+ */
}


/* ---- the segments' trie: node 0 is the root; the child of (node, character) is found in an
   open-addressing table keyed by node << 21 | character (a code point has at most 21 bits) */

typedef struct {
    int64_t *keys;  /* -1 where empty */
    int32_t *child;
    int32_t *id;    /* per node: the id of the segment that ends there, or -1 */
    size_t mask;
    int marks;      /* whether a segment is a word end: a letter, then the character 0 */
} Trie;

static const char *TRIE_NAME = "andrea.tokenizer._harris.trie";

static inline size_t slot_of(const Trie *t, int64_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & t->mask;
}

static inline int32_t trie_child(const Trie *t, int32_t node, Py_UCS4 c)
{
    int64_t key = ((int64_t)node << 21) | c;
    for (size_t s = slot_of(t, key);; s = (s + 1) & t->mask) {
        if (t->keys[s] == key)
            return t->child[s];
        if (t->keys[s] < 0)
            return -1;
    }
}

static void trie_free(PyObject *capsule)
{
    Trie *t = PyCapsule_GetPointer(capsule, TRIE_NAME);
    if (t != NULL) {
        free(t->keys);
        free(t->child);
        free(t->id);
        free(t);
    }
}

static PyObject *make_trie(PyObject *self, PyObject *args)
{
    PyObject *segments;
    long first;
    if (!PyArg_ParseTuple(args, "O!l:trie", &PyList_Type, &segments, &first))
        return NULL;
    Py_ssize_t n_seg = PyList_GET_SIZE(segments), chars = 0;
    for (Py_ssize_t k = 0; k < n_seg; k++) {
        PyObject *s = PyList_GET_ITEM(segments, k);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "segments must be strings");
            return NULL;
        }
        if (ready(s) < 0)
            return NULL;
        chars += PyUnicode_GET_LENGTH(s);
    }
    size_t size = 16;
    while (size < 2 * (size_t)chars + 2)
        size *= 2;
    Trie *t = calloc(1, sizeof(Trie));
    if (t == NULL)
        return PyErr_NoMemory();
    t->keys = malloc(size * sizeof(int64_t));
    t->child = malloc(size * sizeof(int32_t));
    t->id = malloc(((size_t)chars + 1) * sizeof(int32_t));
    t->mask = size - 1;
    if (t->keys == NULL || t->child == NULL || t->id == NULL) {
        free(t->keys), free(t->child), free(t->id), free(t);
        return PyErr_NoMemory();
    }
    memset(t->keys, 0xff, size * sizeof(int64_t));
    int32_t nodes = 1;
    t->id[0] = -1;
    for (Py_ssize_t k = 0; k < n_seg; k++) {
        PyObject *s = PyList_GET_ITEM(segments, k);
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        int32_t node = 0;
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        if (len >= 2 && PyUnicode_READ(kind, data, len - 1) == 0 && char_class(PyUnicode_READ(kind, data, len - 2)) == LETTER)
            t->marks = 1;
        for (Py_ssize_t i = 0; i < len; i++) {
            int64_t key = ((int64_t)node << 21) | PyUnicode_READ(kind, data, i);
            size_t slot = slot_of(t, key);
            while (t->keys[slot] >= 0 && t->keys[slot] != key)
                slot = (slot + 1) & t->mask;
            if (t->keys[slot] < 0) {
                t->keys[slot] = key;
                t->child[slot] = nodes;
                t->id[nodes++] = -1;
            }
            node = t->child[slot];
        }
        t->id[node] = (int32_t)(first + k);
    }
    PyObject *capsule = PyCapsule_New(t, TRIE_NAME, trie_free);
    if (capsule == NULL)
        free(t->keys), free(t->child), free(t->id), free(t);
    return capsule;
}

static PyObject *trie_set(PyObject *self, PyObject *args)
{
    PyObject *capsule, *segment;
    long id;
    if (!PyArg_ParseTuple(args, "OUl:set_id", &capsule, &segment, &id))
        return NULL;
    Trie *t = PyCapsule_GetPointer(capsule, TRIE_NAME);
    if (t == NULL || ready(segment) < 0)
        return NULL;
    int kind = PyUnicode_KIND(segment);
    const void *data = PyUnicode_DATA(segment);
    int32_t node = 0;
    for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(segment) && node >= 0; i++)
        node = trie_child(t, node, PyUnicode_READ(kind, data, i));
    if (node <= 0) {
        PyErr_SetString(PyExc_KeyError, "set_id: the segment is not in the trie");
        return NULL;
    }
    t->id[node] = (int32_t)id;
    Py_RETURN_NONE;
}

/* Step 2 of the encoding rule on text[a:b], as a tuple of ids; where `marked`, a word end may
   match the rest of the span. */
static PyObject *encode_span(const Trie *t, int kind, const void *data, Py_ssize_t a, Py_ssize_t b, int marked)
{
    int32_t stack[64], *ids = stack;
    Py_ssize_t cap = 64, len = 0;
    PyObject *out = NULL;
    for (Py_ssize_t i = a; i < b;) {
        if (len + 4 > cap) { /* room for one more segment or the 4 bytes of one character */
            int32_t *more = malloc(2 * cap * sizeof(int32_t));
            if (more == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            memcpy(more, ids, len * sizeof(int32_t));
            if (ids != stack)
                free(ids);
            ids = more;
            cap *= 2;
        }
        int32_t node = 0, best = -1;
        Py_ssize_t end = i + 1;
        for (Py_ssize_t j = i; j < b; j++) {
            node = trie_child(t, node, PyUnicode_READ(kind, data, j));
            if (node < 0)
                break;
            if (t->id[node] >= 0 && !(marked && j + 1 == b))
                best = t->id[node], end = j + 1;
        }
        if (marked && node >= 0) { /* every character to the end matched: is the rest a word end? */
            int32_t fin = trie_child(t, node, 0);
            if (fin >= 0 && t->id[fin] >= 0)
                best = t->id[fin], end = b;
        }
        if (best >= 0) {
            ids[len++] = best;
        } else { /* one character, as its UTF-8 bytes (a surrogate as 'surrogatepass' writes it) */
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c < 0x80) {
                ids[len++] = (int32_t)c;
            } else if (c < 0x800) {
                ids[len++] = 0xC0 | (c >> 6);
                ids[len++] = 0x80 | (c & 0x3F);
            } else if (c < 0x10000) {
                ids[len++] = 0xE0 | (c >> 12);
                ids[len++] = 0x80 | ((c >> 6) & 0x3F);
                ids[len++] = 0x80 | (c & 0x3F);
            } else {
                ids[len++] = 0xF0 | (c >> 18);
                ids[len++] = 0x80 | ((c >> 12) & 0x3F);
                ids[len++] = 0x80 | ((c >> 6) & 0x3F);
                ids[len++] = 0x80 | (c & 0x3F);
            }
        }
        i = end;
    }
    out = PyTuple_New(len);
    for (Py_ssize_t k = 0; out != NULL && k < len; k++) {
        PyObject *v = PyLong_FromLong(ids[k]);
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, k, v);
    }
done:
    if (ids != stack)
        free(ids);
    return out;
}

static PyObject *encode_word(PyObject *self, PyObject *args)
{
    PyObject *capsule, *word;
    int marked = 0;
    if (!PyArg_ParseTuple(args, "OU|p:encode_word", &capsule, &word, &marked))
        return NULL;
    Trie *t = PyCapsule_GetPointer(capsule, TRIE_NAME);
    if (t == NULL || ready(word) < 0)
        return NULL;
    return encode_span(t, PyUnicode_KIND(word), PyUnicode_DATA(word), 0, PyUnicode_GET_LENGTH(word), marked);
}

/* ---- the words of a text, and their ids */

static PyObject *split(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "split takes a str, not %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (ready(text) < 0)
        return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0;
    PyObject *words = PyList_New(0);
    if (words == NULL)
        return NULL;
    while (i < n) {
        Py_ssize_t j = word_end(kind, data, i, n);
        PyObject *word = PyUnicode_Substring(text, i, j);
        if (word == NULL || PyList_Append(words, word) < 0) {
            Py_XDECREF(word);
            Py_DECREF(words);
            return NULL;
        }
        Py_DECREF(word);
        i = j;
    }
    return words;
}

static PyObject *encode(PyObject *self, PyObject *args)
{
    PyObject *text, *cache, *out, *capsule;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "UO!O!On:encode", &text, &PyDict_Type, &cache, &PyList_Type, &out, &capsule, &limit))
        return NULL;
    Trie *t = PyCapsule_GetPointer(capsule, TRIE_NAME);
    if (t == NULL || ready(text) < 0)
        return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0;
    while (i < n) {
        Py_ssize_t j = word_end(kind, data, i, n);
        PyObject *word = PyUnicode_Substring(text, i, j);
        if (word == NULL)
            return NULL;
        PyObject *ids = PyDict_GetItemWithError(cache, word); /* borrowed */
        if (ids != NULL) {
            Py_INCREF(ids);
        } else if (!PyErr_Occurred()) { /* a word not seen yet */
            int marked = t->marks && char_class(PyUnicode_READ(kind, data, j - 1)) == LETTER
                         && PyUnicode_READ(kind, data, i) != '\'';
            ids = encode_span(t, kind, data, i, j, marked);
            if (ids != NULL && PyDict_GET_SIZE(cache) >= limit)
                PyDict_Clear(cache);
            if (ids != NULL && PyDict_SetItem(cache, word, ids) < 0)
                Py_CLEAR(ids);
        }
        Py_DECREF(word);
        if (ids == NULL)
            return NULL;
        if (!PyTuple_Check(ids)) {
            PyErr_SetString(PyExc_TypeError, "the word cache must map words to tuples of ids");
            Py_DECREF(ids);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ids); k++) {
            if (PyList_Append(out, PyTuple_GET_ITEM(ids, k)) < 0) {
                Py_DECREF(ids);
                return NULL;
            }
        }
        Py_DECREF(ids);
        i = j;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"split", split, METH_O, "split(text) -> the words of text: re.findall(WORD_PATTERN, text)."},
    {"trie", make_trie, METH_VARARGS, "trie(segments, first_id) -> the segments' trie (a capsule)."},
    {"set_id", trie_set, METH_VARARGS,
     "set_id(trie, segment, id) -> None: give a segment of the trie another id (-1: no longer a segment)."},
    {"encode_word", encode_word, METH_VARARGS, "encode_word(trie, word) -> the ids of one word, a tuple."},
    {"encode", encode, METH_VARARGS,
     "encode(text, cache, out, trie, limit) -> None: append to out the ids of each word of text."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "andrea.tokenizer._harris",
                                    "The Harris tokenizer's word splitting and lookup, compiled.", -1, methods};

PyMODINIT_FUNC PyInit__harris(void)
{
    for (Py_UCS4 c = 0; c < 128; c++) {
        if (Py_UNICODE_ISSPACE(c))
            ascii_class[c] = SPACE;
        else if (c == '_')
            ascii_class[c] = UNDERSCORE;
        else if (Py_UNICODE_ISDECIMAL(c))
            ascii_class[c] = DIGIT;
        else if (Py_UNICODE_ISALNUM(c))
            ascii_class[c] = LETTER;
        else
            ascii_class[c] = PUNCT;
    }
    return PyModule_Create(&module);
}
