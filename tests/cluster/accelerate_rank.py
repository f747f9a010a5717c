"""An Accelerate script (accelerate 0.33 on CPU): what Accelerator() says of
the world, and a gather of every process index. Writes
OUT_DIR/accelerate-<rank>.json. The process group is destroyed before the
interpreter ends: left to exit, PyTorch 1.13's Gloo group can be torn
down while its threads still run, and a rank dies of SIGABRT ("terminate
called without an active exception"; seen once in CI)."""
import json
import os

import torch
import torch.distributed
from accelerate import Accelerator

acc = Accelerator(cpu=True)
gathered = acc.gather(torch.tensor([acc.process_index]))
out = {"process_index": acc.process_index, "num_processes": acc.num_processes,
       "local_process_index": acc.local_process_index,
       "is_main_process": acc.is_main_process,
       "distributed_type": str(acc.distributed_type), "gathered": gathered.tolist()}
with open(os.path.join(os.environ["OUT_DIR"], "accelerate-%d.json" % acc.process_index),
          "w") as f:
    json.dump(out, f)
acc.wait_for_everyone()
torch.distributed.destroy_process_group()
