"""The main job's parts (deploy/train_digits.py is the program over them): `cli` its flags, `runs`
the run specs (one run = one configuration trained to the target), `models` the workloads (the
MLP on digits, the LSTM language model, the CNN on Fashion-MNIST: data, model, loss,
evaluation), `hooks` the PyTorch peers and the spex hook as DDP sees them, `train` one trainer
process training every run in turn, `launch` the cluster and the trainer processes, `procs` what
/proc says about the daemons, `report` the tables, CSVs, summary.json and the plot."""
