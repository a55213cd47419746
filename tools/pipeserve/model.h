/*
 * The served model at start-up (model.c): its weights from --model or the built-in demo model, its name in
 * URLs, its split into stages, what the protocol shows of it (s->info); and the two commands that only read
 * or write a model file (--describe, --write-demo-model). Under mpirun a rank holds only its stages'
 * layers (mpi.c loads them). A live reload later swaps new weights into the same model (server.c).
 */
#ifndef PIPESERVE_MODEL_H
#define PIPESERVE_MODEL_H

#include "server.h"

/*
 * Load the model (--model, the demo model, or under mpirun this rank's layers), name it and split it into
 * stages: s->model, s->name, s->model_path, s->plan, s->stages, s->info. Undo with ps_model_teardown().
 * @return 0, PS_EUSAGE (the arguments' fault, said), or -errno (said).
 */
int ps_model_setup(ps_server *s);

/* Free what ps_model_setup() made, also after it failed half-way or never ran. */
void ps_model_teardown(ps_server *s);

/* --write-demo-model FILE: the --demo model with its random weights. @return the exit status. */
int ps_model_write_demo(const ps_config *c);

/* --describe FILE: load it (within --max-model-bytes) and print its layers. @return the exit status. */
int ps_model_describe(const ps_config *c);

#endif
