/* consumer._speedups: the per-record steps of reading from Kafka, compiled.
 *
 * What consumer/records.py does in Python for every record poll() hands out, here in C:
 * making a KafkaRecord of librdkafka's Message, and reading a field of one. records.py uses
 * these when this module was built (setup.py builds it where a C compiler and Python's headers
 * are present) and its pure-Python equivalents otherwise, or with ZKGROUPS_NO_EXTENSIONS=1;
 * tests/unit/test_records.py runs against both. It also holds the Kafka producer's send fast
 * path (FastSend, below), which consumer/send_path.py uses the same way.
 *
 * The records are not tracked by the cyclic garbage collector: a KafkaRecord holds one
 * Message (its class has no __dict__ and no other slot) and a Message holds only its own
 * values (bytes, str, the headers' pairs, an error), so no cycle can go through one. Untracked, a batch of records
 * costs no collection and a full collection does not walk the records a program keeps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#if PY_VERSION_HEX < 0x030A0000  /* Python 3.9 */
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
#endif

static PyObject *s_topic, *s_partition, *s_offset, *s_timestamp, *s_key, *s_value, *s_headers;
static PyObject *minus_one;  /* librdkafka's "any partition": its partitioner picks */

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


/* ---------------------------------------------------------------- the producer's send fast path
 *
 * FastSend(ready, budget, produce, new_future, checked): what KafkaSendPath.send does on its
 * fast path, without its Python frame. A call send(topic, value[, key]) (by position or by
 * name) with a topic in
 * `ready` (a set), a bytes value and a bytes or None key, while `budget` (a list) is not empty:
 * one item popped from `budget`, a future made by `new_future()` (None: no futures), and
 * produce(topic, value, key, -1, future); it returns the future. Anything else, and a produce
 * that raises an Exception, goes to `checked` with the same arguments (the Python send, whose
 * checks and errors are the producer's). The set and the list are the producer's own: it
 * empties `ready` and refills `budget` in place. Holds the checked send, a method of the
 * producer, so it takes part in the cyclic GC. */
typedef struct {
    PyObject_HEAD
    PyObject *ready, *budget, *produce, *new_future, *checked;
    vectorcallfunc vectorcall;
} FastSend;

/* Whether the keyword `name` is `known` (keywords are mostly interned: identity first). */
static int
is_keyword(PyObject *name, PyObject *known)
{
    return name == known || PyUnicode_Compare(name, known) == 0;
}

static PyObject *
fast_send_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastSend *self = (FastSend *)op;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (n > 3)
        goto checked;
    /* send(topic, value, key) in any mix of positions and keywords (kafka-python's programs
     * often name them); any other keyword, or one given twice, is the checked send's. */
    PyObject *topic = n > 0 ? args[0] : NULL, *value = n > 1 ? args[1] : NULL, *key = n > 2 ? args[2] : NULL;
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), **slot;
        if (is_keyword(name, s_value))
            slot = &value;
        else if (is_keyword(name, s_key))
            slot = &key;
        else if (is_keyword(name, s_topic))
            slot = &topic;
        else
            goto checked;
        if (*slot != NULL)
            goto checked;
        *slot = args[n + i];
    }
    if (key == NULL)
        key = Py_None;
    Py_ssize_t left = PyList_GET_SIZE(self->budget);
    if (topic == NULL || value == NULL || left == 0 || !PyBytes_CheckExact(value)
            || (key != Py_None && !PyBytes_CheckExact(key)))
        goto checked;
    int ready = PySet_Contains(self->ready, topic);
    if (ready < 0)
        PyErr_Clear();  /* an unhashable topic: the checked send says what is wrong */
    if (ready != 1)
        goto checked;
    PyObject *future = self->new_future == Py_None ? Py_NewRef(Py_None) : PyObject_CallNoArgs(self->new_future);
    if (future == NULL)
        return NULL;
    if (PyList_SetSlice(self->budget, left - 1, left, NULL) < 0) {
        Py_DECREF(future);
        return NULL;
    }
    PyObject *produce_args[5] = {topic, value, key, minus_one, future};
    PyObject *produced = PyObject_Vectorcall(self->produce, produce_args, 5, NULL);
    if (produced != NULL) {
        Py_DECREF(produced);
        return future;
    }
    Py_DECREF(future);
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;  /* KeyboardInterrupt and the like are not the producer's to handle */
    PyErr_Clear();    /* a full queue or an error of librdkafka: the checked send deals with it */
checked:
    return PyObject_Vectorcall(self->checked, args, nargsf, kwnames);
}

static PyObject *
fast_send_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *ready, *budget, *produce, *new_future, *checked;
    if (!PyArg_ParseTuple(args, "O!O!OOO:FastSend", &PySet_Type, &ready, &PyList_Type, &budget, &produce,
                          &new_future, &checked))
        return NULL;
    FastSend *self = (FastSend *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->ready = Py_NewRef(ready);
    self->budget = Py_NewRef(budget);
    self->produce = Py_NewRef(produce);
    self->new_future = Py_NewRef(new_future);
    self->checked = Py_NewRef(checked);
    self->vectorcall = fast_send_call;
    return (PyObject *)self;
}

static int
fast_send_traverse(PyObject *op, visitproc visit, void *arg)
{
    FastSend *self = (FastSend *)op;
    Py_VISIT(self->ready);
    Py_VISIT(self->budget);
    Py_VISIT(self->produce);
    Py_VISIT(self->new_future);
    Py_VISIT(self->checked);
    return 0;
}

static int
fast_send_clear(PyObject *op)
{
    FastSend *self = (FastSend *)op;
    Py_CLEAR(self->ready);
    Py_CLEAR(self->budget);
    Py_CLEAR(self->produce);
    Py_CLEAR(self->new_future);
    Py_CLEAR(self->checked);
    return 0;
}

static void
fast_send_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op);
    fast_send_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyTypeObject FastSendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "consumer._speedups.FastSend",
    .tp_doc = "FastSend(ready, budget, produce, new_future, checked): the Kafka producer's send fast path.",
    .tp_basicsize = sizeof(FastSend),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fast_send_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastSend, vectorcall),
    .tp_traverse = fast_send_traverse,
    .tp_clear = fast_send_clear,
    .tp_dealloc = fast_send_dealloc,
};

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
    if ((minus_one = PyLong_FromLong(-1)) == NULL || PyType_Ready(&FastSendType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FastSendType);
    if (PyModule_AddObject(m, "FastSend", (PyObject *)&FastSendType) < 0) {
        Py_DECREF(&FastSendType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
