"""The collective families of tensor parallelism (`all_reduce`, `all_gather`, `all_argmax`): torch.distributed
collectives over the process group the runtime created for the plan's group name."""
