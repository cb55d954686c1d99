"""Paired step-time benchmark: full vs LoRA, torch threads 1 vs 2, same task/prompts, a few GRPO steps each."""
import sys, time, os, json
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from peft import LoraConfig
from tasks import TASKS, make_set
M = "smollm2-135m-instruct"; tok = AutoTokenizer.from_pretrained(M)
rew = TASKS["add1_last"][1]
train = make_set("add1_last", 40, seed=7)
def reward_fn(completions, answer, **kw):
    return [rew(c[0]["content"], a) for c, a in zip(completions, answer)]
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
res = []
for mode, th in [("full", 1), ("lora", 1), ("full", 2), ("lora", 2)]:
    torch.set_num_threads(th); torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(M, dtype=torch.float32)
    args = GRPOConfig(output_dir="runs/bench", use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
                      max_completion_length=16, num_generations=8, per_device_train_batch_size=16, learning_rate=1e-5 if mode == "full" else 2e-4,
                      max_steps=STEPS, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True)
    tr = GRPOTrainer(model=model, reward_funcs=reward_fn, args=args, train_dataset=Dataset.from_list(train), processing_class=tok,
                     peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM") if mode == "lora" else None)
    gen = [0.0]; f = tr._generate_and_score_completions
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); gen[0] += time.perf_counter() - t; return r
    tr._generate_and_score_completions = g
    walls, gens = [], []
    class CB(TrainerCallback):
        def on_step_begin(self, *a, **k): self.t = time.perf_counter(); self.g = gen[0]
        def on_step_end(self, *a, **k): walls.append(time.perf_counter() - self.t); gens.append(gen[0] - self.g)
    tr.add_callback(CB()); tr.train()
    w = sum(walls[1:]) / len(walls[1:]); gg = sum(gens[1:]) / len(gens[1:])
    r = {"mode": mode, "threads": th, "step_s": w, "gen_s": gg, "train_s": w - gg, "walls": walls, "load": os.getloadavg()}
    res.append(r); print(f"BENCH {mode} threads={th}: step {w:.1f}s = generation {gg:.1f}s + loss fwd/bwd/opt {w-gg:.1f}s  (steps 2..{STEPS}; load {os.getloadavg()[0]:.1f})", flush=True)
json.dump(res, open("runs/stepbench.json", "w"), indent=1)
