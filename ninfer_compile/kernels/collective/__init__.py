"""The collective families of tensor parallelism (`all_reduce`, `all_gather`): torch.distributed
collectives over the process group the runtime created for the plan's group name."""
