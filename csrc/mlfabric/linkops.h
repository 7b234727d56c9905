/* Shared by linkops.c (the link model's loops) and linkops_agg.c
 * (Algorithm 3's trial cases).  See linkops.c for what they are. */
#ifndef MLFABRIC_LINKOPS_H
#define MLFABRIC_LINKOPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define LINKOPS_TOL 1e-9
#define LINKOPS_SMALL 64

/* A growable array of doubles, in a small inline buffer while it fits. */
typedef struct {
    double *v;
    Py_ssize_t n, cap;
    double small[LINKOPS_SMALL];
} Out;

void out_init(Out *o);
int out_push(Out *o, double x);          /* -1 (MemoryError set) */
void out_free(Out *o);
int out_read(PyObject *list, Out *o);   /* a list of floats; -1 on error */
PyObject *out_list(const Out *o);

/* A timeline as the loops see it: cap, and used[i] on [t[i], t[i+1]). */
typedef struct {
    const double *t, *u;
    Py_ssize_t n;
    double cap;
} View;

/* A timeline owned in C. */
typedef struct {
    double cap;
    Out t, u;
} Link;

int link_read(PyObject *timeline, Link *l);  /* out_init'ed; -1 on error */
void link_free(Link *l);
View link_view(const Link *l);

double tolerance(double ca, double cb);
Py_ssize_t segment(const double *v, Py_ssize_t n, double x);

/* t_en over min(residual a, residual b) from start; with points != NULL
 * the profile is recorded (points/rates empty: an infinite rate, or no
 * capacity ever).  *err = 1 on MemoryError. */
double walk(View a, View b, double start, double size, Out *points,
            Out *rates, int *err);
/* The latest start >= earliest from which size completes by end; NAN when
 * there is too little capacity; *err = 1 on MemoryError. */
double latest(View a, View b, double earliest, double end, double size,
              int *err);
/* A reservation (sign = +-1) merged into a timeline: nt/nu are the result
 * (out_init'ed by the caller); -1 on MemoryError. */
int merge(View l, const double *points, Py_ssize_t n_points,
          const double *rates, double sign, Out *nt, Out *nu);

PyObject *det_agg_trial(PyObject *self, PyObject *args);
extern const char det_agg_trial_doc[];

#endif
