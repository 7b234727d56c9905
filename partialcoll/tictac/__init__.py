"""Communication scheduling (TicTac): which parameter transfer goes on the
wire first.

* :mod:`.planner`: TIC and TAC priorities from a worker graph (no MPI, no
  torch);
* :mod:`.graphs`: worker graphs traced from PyTorch models (torch optional);
* :mod:`.metrics`: overlap coefficient, utilisation and the rest of the
  paper's section 3.2, from timelines;
* :mod:`.ps`: a parameter server and its workers on schedules, the
  planner's numbers enforced by the executor's counter gate.
"""
