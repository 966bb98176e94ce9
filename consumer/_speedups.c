/* consumer._speedups: the per-record steps of reading from Kafka, compiled.
 *
 * What consumer/records.py does in Python for every record poll() hands out, here in C:
 * making a KafkaRecord of librdkafka's Message, and reading a field of one. records.py uses
 * these when this module was built (setup.py builds it where a C compiler and Python's headers
 * are present) and its pure-Python equivalents otherwise, or with ZKGROUPS_NO_EXTENSIONS=1;
 * tests/unit/test_records.py runs against both.
 *
 * The records are not tracked by the cyclic garbage collector: a KafkaRecord holds one
 * Message (its class has no __dict__ and no other slot) and a Message holds only its own
 * values (bytes, str, the headers' pairs, an error), so no cycle can go through one. Untracked, a batch of records
 * costs no collection and a full collection does not walk the records a program keeps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_topic, *s_partition, *s_offset, *s_timestamp, *s_key, *s_value, *s_headers;

/* Whether cls's instances are tuples and nothing more (no __dict__, no slot of their own). */
static int
is_plain_tuple_type(PyTypeObject *cls)
{
    return PyType_IsSubtype(cls, &PyTuple_Type) && cls->tp_basicsize == PyTuple_Type.tp_basicsize
           && cls->tp_dictoffset == 0;
}

/* records(cls, messages): [cls holding m for m in messages], cls a tuple subclass with no slots. */
static PyObject *
records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "records(cls, messages) takes a class and a sequence");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (!is_plain_tuple_type(cls)) {
        PyErr_SetString(PyExc_TypeError, "records(cls, messages): cls must be a tuple subclass with no slots");
        return NULL;
    }
    /* A tuple of them: a collection that tp_alloc may start cannot change it under the loop. */
    PyObject *seq = PySequence_Tuple(args[1]);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = cls->tp_alloc(cls, 1);
        if (record == NULL) {
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
        PyObject_GC_UnTrack(record);  /* see the top of this file */
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(record, 0, items[i]);
        PyList_SET_ITEM(out, i, record);
    }
    Py_DECREF(seq);
    return out;
}

/* The Message a KafkaRecord holds (self: a tuple whose item 0 is the Message), borrowed. */
static PyObject *
message_of(PyObject *self)
{
    if (!PyTuple_Check(self) || PyTuple_GET_SIZE(self) < 1) {
        PyErr_Format(PyExc_TypeError, "expected a KafkaRecord, got %.100s", Py_TYPE(self)->tp_name);
        return NULL;
    }
    return PyTuple_GET_ITEM(self, 0);
}

/* Message.timestamp() is (type, milliseconds): the milliseconds. */
static PyObject *
timestamp_of(PyObject *message)
{
    PyObject *pair = PyObject_CallMethodNoArgs(message, s_timestamp);
    if (pair == NULL)
        return NULL;
    PyObject *ms = PySequence_GetItem(pair, 1);
    Py_DECREF(pair);
    return ms;
}

/* Message.headers() is None or a list of pairs: a tuple of them, () for none. */
static PyObject *
headers_of(PyObject *message)
{
    PyObject *headers = PyObject_CallMethodNoArgs(message, s_headers);
    if (headers == NULL)
        return NULL;
    int some = PyObject_IsTrue(headers);
    PyObject *result = some < 0 ? NULL : some ? PySequence_Tuple(headers) : PyTuple_New(0);
    Py_DECREF(headers);
    return result;
}

/* The record's field `name` (one of the seven), read from its Message. */
static PyObject *
field_of(PyObject *message, PyObject *name)
{
    if (name == s_timestamp)
        return timestamp_of(message);
    if (name == s_headers)
        return headers_of(message);
    return PyObject_CallMethodNoArgs(message, name);
}

#define FIELD(name) \
    static PyObject *field_##name(PyObject *module, PyObject *self) { \
        PyObject *message = message_of(self); \
        return message == NULL ? NULL : field_of(message, s_##name); \
    }
FIELD(topic)
FIELD(partition)
FIELD(offset)
FIELD(timestamp)
FIELD(key)
FIELD(value)
FIELD(headers)

/* materialize(cls, record): cls (ConsumerRecord) of the seven values read from record's Message. */
static PyObject *
materialize(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !is_plain_tuple_type((PyTypeObject *)args[0])) {
        PyErr_SetString(PyExc_TypeError, "materialize(cls, record): cls must be a tuple subclass with no slots");
        return NULL;
    }
    PyObject *message = message_of(args[1]);
    if (message == NULL)
        return NULL;
    PyObject *const names[7] = {s_topic, s_partition, s_offset, s_timestamp, s_key, s_value, s_headers};
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *out = cls->tp_alloc(cls, 7);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < 7; i++) {
        PyObject *value = field_of(message, names[i]);
        if (value == NULL) {
            Py_DECREF(out);  /* the items set so far go with it; the rest are NULL, which it allows */
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, value);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))records, METH_FASTCALL,
     "records(cls, messages): a list of cls (a tuple subclass), each holding one of messages."},
    {"topic", field_topic, METH_O, "The record's topic."},
    {"partition", field_partition, METH_O, "The record's partition."},
    {"offset", field_offset, METH_O, "The record's offset."},
    {"timestamp", field_timestamp, METH_O, "The record's timestamp (milliseconds)."},
    {"key", field_key, METH_O, "The record's key."},
    {"value", field_value, METH_O, "The record's value."},
    {"headers", field_headers, METH_O, "The record's headers (a tuple of pairs)."},
    {"materialize", (PyCFunction)(void (*)(void))materialize, METH_FASTCALL,
     "materialize(cls, record): cls (a tuple subclass) of the record's seven values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "consumer._speedups", "The per-record steps of reading from Kafka, compiled.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (!(s_topic = PyUnicode_InternFromString("topic")) || !(s_partition = PyUnicode_InternFromString("partition"))
            || !(s_offset = PyUnicode_InternFromString("offset"))
            || !(s_timestamp = PyUnicode_InternFromString("timestamp"))
            || !(s_key = PyUnicode_InternFromString("key")) || !(s_value = PyUnicode_InternFromString("value"))
            || !(s_headers = PyUnicode_InternFromString("headers")))
        return NULL;
    return PyModule_Create(&module);
}
