/* A CPython extension module that uses only the limited API (abi3-clean). */
#include <Python.h>

static PyObject* triple(PyObject* self, PyObject* arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(3 * v);
}

static PyMethodDef methods[] = {{"triple", triple, METH_O, "3 * x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fast(void) { return PyModule_Create(&module); }
