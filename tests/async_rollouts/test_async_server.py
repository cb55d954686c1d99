"""Asynchronous rollouts sampled ahead by TRL's vLLM server (``async_generator="server"``).

vLLM cannot run here (no CUDA). TRL's ``VLLMGeneration`` is replaced by a stand-in in server mode whose client plays
the server: it holds a copy of the model with the weights last pushed by ``sync_weights`` (as the real server holds
what TRL's weight sync sent), samples ``n`` completions per prompt in the request's thread and answers in vLLM's
shapes. What is checked: every batch is sampled by the weights of ``k`` generation steps earlier, the request for a
batch goes out ``k`` steps before the batch is trained, no weight push lands while a request is in flight, the
trainer's own vLLM generation (evaluation, dynamic sampling's extra rounds) still sees the right weights, DPPO's top-K
is the server's, and a server that fails or hangs is an error within ``async_timeout``. The plumbing is tested at
TRL's interface; a real vLLM server is not.
"""

from __future__ import annotations

import copy
import threading
import time
import warnings

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from conftest import cpu_args, digit_fraction, logged_metric, make_prompts
from transformers import TrainerCallback

import trl_reasoning as tr
from trl_reasoning.async_rollouts.protocols import GeneratorError


def fingerprint(model: torch.nn.Module) -> float:
    """A number that identifies the trainable weights (they change at every optimizer step here)."""
    return round(sum(float(p.detach().double().sum()) for p in model.parameters() if p.requires_grad), 9)


class StandInServer:
    """The vLLM server behind ``VLLMClient``: the model with the weights last pushed; ``generate`` as the client's."""

    def __init__(self, model: torch.nn.Module, eos_token_id: int):
        # a model of its own, built from the config: a deep copy would keep the forward TRL binds to the trainer's
        # model (its fused LM head), and sample with the trainer's current weights instead of those pushed
        self.engine = type(model)(copy.deepcopy(model.config)).eval()
        self.engine.load_state_dict(model.state_dict())
        self.eos_token_id = eos_token_id
        self.loaded: float | None = None
        self.in_flight = 0
        self.pushes_during_requests = 0
        self.requests: list[dict] = []  # per request: the weights it sampled with, its prompts, the thread
        self.delay = 0.0  # seconds each request takes on top of sampling (a hanging server: large)
        self.fail = False
        self._random = torch.Generator().manual_seed(11)
        self._lock = threading.Lock()

    def load(self, model: torch.nn.Module) -> None:
        with self._lock:
            if self.in_flight:
                self.pushes_during_requests += 1
            self.engine.load_state_dict(model.state_dict())
            self.loaded = fingerprint(model)

    def get_server_info(self) -> dict:
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def reset_prefix_cache(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):  # fmt: skip
        with self._lock:
            self.in_flight += 1
            weights = self.loaded
        try:
            time.sleep(self.delay)
            if self.fail:
                raise ConnectionError("the stand-in server is down")
            completion_ids, all_logps, all_ids = [], [], []
            for prompt in prompts:
                for _ in range(n):
                    ids, seq_logps, seq_ids = [], [], []
                    while len(ids) < max_tokens:
                        logits = self.engine(input_ids=torch.tensor([list(prompt) + ids])).logits[0, -1].double()
                        full = torch.log_softmax(logits / temperature, dim=-1)
                        token = int(torch.multinomial(full.exp(), 1, generator=self._random))
                        entries = torch.argsort(full, descending=True).tolist()[:logprobs] if logprobs else []
                        entries = entries if token in entries else [*entries, token]
                        ids.append(token)
                        seq_ids.append(entries)
                        seq_logps.append([float(full[e]) for e in entries])
                        if token == self.eos_token_id:
                            break
                    completion_ids.append(ids)
                    all_logps.append(seq_logps)
                    all_ids.append(seq_ids)
            self.requests.append(
                {"weights": weights, "prompts": [list(p) for p in prompts], "thread": threading.current_thread()}
            )
            return {"prompt_ids": prompts, "completion_ids": completion_ids, "logprobs": all_logps,
                    "logprob_token_ids": all_ids}  # fmt: skip
        finally:
            with self._lock:
                self.in_flight -= 1


class ServerModeGeneration:
    """Stand-in for ``trl.generation.vllm_generation.VLLMGeneration`` in server mode (single process): its sampling
    settings, ``vllm_client``, ``sync_weights`` (pushes the model's current weights) and ``generate`` (TRL's
    synchronous path: one request for the unique prompts)."""

    def __init__(self, *, model, mode, temperature, top_p, top_k, min_p, repetition_penalty, max_completion_length,
                 logprobs, structured_outputs_regex, generation_kwargs, processing_class, **kwargs):  # fmt: skip
        assert mode == "server"
        self.model, self.mode = model, mode
        self.temperature, self.top_p, self.top_k, self.min_p = temperature, top_p, top_k, min_p
        self.repetition_penalty, self.max_completion_length = repetition_penalty, max_completion_length
        self.logprobs, self.structured_outputs_regex = logprobs, structured_outputs_regex
        self.generation_kwargs = generation_kwargs or {}
        self.vllm_client = StandInServer(model, processing_class.eos_token_id)
        self.synchronous: list[float | None] = []  # the server's weights at each of TRL's own generate calls

    def sync_weights(self):
        self.vllm_client.load(self.model)

    def generate(self, prompts, images, num_generations, profiler=None):
        self.synchronous.append(self.vllm_client.loaded)
        output = self.vllm_client.generate(
            prompts=prompts[::num_generations],
            n=num_generations,
            temperature=self.temperature,
            max_tokens=self.max_completion_length,
            logprobs=self.logprobs,
        )
        return prompts, output["completion_ids"], output["logprobs"], output["logprob_token_ids"]


@pytest.fixture
def server_standin(monkeypatch):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", ServerModeGeneration)


class Timeline(TrainerCallback):
    """The weights at each generation step (from the trainer's own snapshots) and, at the end of each optimizer
    step, the generation steps already sent to the server."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.weights: list[float] = []
        self.sent_at_step_end: list[set[int]] = []
        record = trainer.async_rollouts.behaviour.record

        def recorded(params):
            self.weights.append(round(sum(float(p.detach().double().sum()) for p in params.values()), 9))
            return record(params)

        trainer.async_rollouts.behaviour.record = recorded

    def on_step_end(self, args, state, control, **kwargs):
        pipeline = self.trainer.async_rollouts.pipeline
        self.sent_at_step_end.append(set(pipeline._jobs) if pipeline._generator is not None else set())


def _trainer(model_path, tmp_path, config_cls=tr.ReasoningConfig, trainer_cls=tr.ReasoningTrainer, **overrides):
    settings = dict(
        use_vllm=True,
        vllm_mode="server",
        async_rollouts=True,
        async_generator="server",
        max_staleness=2,
        max_steps=6,
        max_completion_length=6,
    )
    settings.update(overrides)
    args = config_cls(**cpu_args(output_dir=str(tmp_path), **settings))
    eval_dataset = make_prompts(8) if settings.get("eval_strategy", "no") != "no" else None
    return trainer_cls(
        model=model_path,
        reward_funcs=digit_fraction,
        args=args,
        train_dataset=make_prompts(16),
        eval_dataset=eval_dataset,
    )


def _ahead_requests(trainer) -> list[dict]:
    return [r for r in trainer.vllm_generation.vllm_client.requests if r["thread"] is not threading.main_thread()]


@pytest.mark.parametrize(
    ("config_cls", "trainer_cls", "overrides"),
    [
        (tr.ReasoningConfig, tr.ReasoningTrainer, dict(policy_loss="clip")),
        (tr.ReasoningConfig, tr.ReasoningTrainer, dict(policy_loss="clip", ratio_anchor="pi_old")),
        (tr.CISPOConfig, tr.CISPOTrainer, dict(dynamic_sampling=False)),  # extra rounds: the next test
        (tr.DPPOConfig, tr.DPPOTrainer, {}),
        (tr.DAPOConfig, tr.DAPOTrainer, dict(dynamic_sampling=False)),
        (tr.ReinforcePPConfig, tr.ReinforcePPTrainer, {}),  # per-token advantages, the KL in their return
        # the KL term with its reference reset every 2 steps; one generation per optimizer step, as the server needs
        (
            tr.ProRLConfig,
            tr.ProRLTrainer,
            dict(dynamic_sampling=False, steps_per_generation=1, reference_reset_steps=2),
        ),
    ],
    ids=["clip", "clip-on-pi_old", "cispo", "dppo", "dapo", "reinforce_pp", "prorl"],
)
def test_each_batch_is_sampled_ahead_by_the_weights_of_k_steps_earlier(
    config_cls, trainer_cls, overrides, server_standin, tiny_model_path, tmp_path
):
    k, steps = 2, 6
    trainer = _trainer(tiny_model_path, tmp_path, config_cls, trainer_cls, max_staleness=k, **overrides)
    timeline = Timeline(trainer)
    trainer.add_callback(timeline)
    trainer.train()
    server = trainer.vllm_generation.vllm_client
    requests = _ahead_requests(trainer)
    # one request per trained batch, from the background thread, sampled by the weights of step max(g - k, 0)
    assert len(requests) == steps and not trainer.vllm_generation.synchronous
    assert [r["weights"] for r in requests] == [timeline.weights[max(g - k, 0)] for g in range(steps)]
    assert len(set(timeline.weights)) == steps, "the weights did not change at every step: the check is vacuous"
    # sent ahead: when optimizer step s ends, the batch of step s + k is already with the server
    for s, sent in enumerate(timeline.sent_at_step_end):
        if s + k < steps:
            assert s + k in sent, f"the batch of step {s + k} was not sent by the end of step {s}"
    assert server.pushes_during_requests == 0
    assert logged_metric(trainer, "async/staleness") == [float(min(g, k)) for g in range(steps)]
    assert all(torch.isfinite(torch.tensor(logged_metric(trainer, "loss"))))
    if trainer.args.ratio_anchor == "sampler":  # the asynchronous default: the ratio is against the server's
        assert logged_metric(trainer, "async/sampler_ratio/mean"), "the ratio to the sampler was not logged"
        assert not logged_metric(trainer, "sampling/importance_sampling_ratio/mean"), "a second correction ran"
    else:
        assert logged_metric(trainer, "sampling/importance_sampling_ratio/mean"), "TRL's IS correction did not run"
    assert trainer.async_rollouts.pipeline._generator is None, "the request thread outlived train()"
    if trainer.reference_reset is not None:  # ProRL: the trainer scores its own reference, reset at steps 2, 4, 6
        assert logged_metric(trainer, "reference/resets") == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
        kl = logged_metric(trainer, "kl")
        assert abs(kl[2]) < 1e-7 and abs(kl[4]) < 1e-7 and kl[1] > 0, kl  # 0 right after each reset


def test_evaluation_and_extra_rounds_use_the_servers_right_weights(server_standin, tiny_model_path, tmp_path):
    """TRL's own vLLM generation in between (an evaluation with the current weights, dynamic sampling's extra rounds
    with the behaviour weights) waits for the requests in flight, and the next batch sent ahead gets its weights
    pushed again."""
    k, steps = 1, 6
    trainer = _trainer(
        tiny_model_path,
        tmp_path,
        tr.DAPOConfig,
        tr.DAPOTrainer,
        max_staleness=k,
        max_steps=steps,
        max_num_gen_batches=3,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=8,
    )
    timeline = Timeline(trainer)
    trainer.add_callback(timeline)
    calls = []  # (generation step, training?, the server's weights) of TRL's own generate calls
    generate = trainer.vllm_generation.generate

    def recorded(*args, **kwargs):
        output = generate(*args, **kwargs)
        calls.append(
            (
                trainer.async_rollouts.behaviour.generation_steps - 1,
                trainer.model.training,
                trainer.vllm_generation.synchronous[-1],
            )
        )
        return output

    trainer.vllm_generation.generate = recorded
    trainer.train()
    requests = _ahead_requests(trainer)
    assert [r["weights"] for r in requests] == [timeline.weights[max(g - k, 0)] for g in range(steps)]
    evaluations = [weights for _, training, weights in calls if not training]
    assert evaluations, "no evaluation ran"
    extra_rounds = [(g, weights) for g, training, weights in calls if training]
    assert all(weights == timeline.weights[max(g - k, 0)] for g, weights in extra_rounds)
    assert trainer.vllm_generation.vllm_client.pushes_during_requests == 0
    assert logged_metric(trainer, "eval_loss") or logged_metric(trainer, "eval_reward")


def test_dppo_topk_takes_the_servers_own_top_k(server_standin, tiny_model_path, tmp_path):
    trainer = _trainer(
        tiny_model_path, tmp_path, tr.DPPOConfig, tr.DPPOTrainer, dppo_divergence="topk_tv", dppo_topk=3, max_steps=3
    )
    kept = []
    rollout_topk = trainer.topk_forward._engine_rollout_topk

    def recorded(output):
        kept.append(list(trainer._engine_topk))
        return rollout_topk(output)

    trainer.topk_forward._engine_rollout_topk = recorded
    trainer.train()
    assert len(kept) == 3 and all(len(call) == 1 for call in kept), "DPPO did not read the server's top-K"
    assert all(len(entries) >= 3 for call in kept for seq in call[0][2] for entries in seq)
    assert all(torch.isfinite(torch.tensor(logged_metric(trainer, "loss"))))


@pytest.mark.parametrize("how", ["fails", "hangs"])
def test_a_server_that_fails_or_hangs_is_an_error_in_bounded_time(how, server_standin, tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, async_timeout=3.0, max_steps=4)
    server = trainer.vllm_generation.vllm_client
    if how == "fails":
        server.fail = True
    else:
        server.delay = 30.0
    started = time.monotonic()
    match = "request for generation step 0 failed" if how == "fails" else "did not .* within 3 s"
    with pytest.raises(GeneratorError, match=match):
        trainer.train()
    assert time.monotonic() - started < 25


def test_server_generator_refusals(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="async_generator='server'.*use_vllm=True and vllm_mode='server'"):
        tr.ReasoningConfig(**cpu_args(), async_rollouts=True, max_staleness=1, async_generator="server")
    with pytest.raises(ValueError, match="async_generator='server'.*max_staleness >= 1"):
        tr.ReasoningConfig(
            **cpu_args(), use_vllm=True, vllm_mode="server", async_rollouts=True, max_staleness=0,
            async_generator="server",
        )  # fmt: skip
    with pytest.raises(ValueError, match="async_generator must be 'inline', 'process' or 'server'"):
        tr.ReasoningConfig(**cpu_args(), async_generator="thread")


def test_server_generator_refuses_more_than_one_generation_per_step(server_standin, tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="async_generator='server' does not support more or less than one"):
        _trainer(tiny_model_path, tmp_path, steps_per_generation=2)


def test_a_push_that_waits_for_a_server_that_never_answers_is_an_error_in_bounded_time(
    server_standin, tiny_model_path, tmp_path
):
    """The next batch's weights are pushed only after the requests in flight are answered (``release``): a server
    that never answers them is a ``GeneratorError`` after ``async_timeout`` (decided on the main process and shared
    with every rank), not a wait forever."""
    from trl_reasoning.async_rollouts.behaviour import trainable_parameters
    from trl_reasoning.async_rollouts.protocols import GenerationJob, VersionedWeights

    trainer = _trainer(tiny_model_path, tmp_path, async_timeout=2.0, max_staleness=1, max_steps=4)
    generator = trainer.async_rollouts.pipeline.generator
    prompt_ids = trainer.tokenize_prompts([make_prompts(1)[0]["prompt"]] * trainer.num_generations)
    params = trainable_parameters(trainer.model)
    snapshot = VersionedWeights(0, {name: p.detach().clone() for name, p in params.items()})
    generator.submit(GenerationJob(0, prompt_ids, snapshot, seed=0))
    generator.result(0)
    trainer.vllm_generation.vllm_client.delay = 30.0  # the server stops answering
    generator.submit(GenerationJob(1, prompt_ids, snapshot, seed=0))  # the same weights: no push, sent at once
    newer = VersionedWeights(1, {name: tensor.clone() for name, tensor in snapshot.tensors.items()})
    started = time.monotonic()
    with pytest.raises(GeneratorError, match=r"did not answer the requests of generation steps \[1\] within 2 s"):
        generator.submit(GenerationJob(2, prompt_ids, newer, seed=0))  # a push: waits for step 1 first
    assert time.monotonic() - started < 20
    trainer.async_rollouts.pipeline.close()


def test_a_queue_of_slow_healthy_requests_trains(server_standin, tiny_model_path, tmp_path):
    """``async_timeout`` is per request, counted from its sending: with k = 4 the first five batches go out together
    and are served one after another (over 5 s in all), each within the timeout (a request's 1 s, plus a margin)."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=4, max_steps=6)
    server = trainer.vllm_generation.vllm_client
    prompt_ids = trainer.tokenize_prompts([make_prompts(1)[0]["prompt"]])
    started = time.monotonic()
    server.generate(prompts=prompt_ids * 2, n=trainer.num_generations, max_tokens=trainer.max_completion_length)
    sampling = time.monotonic() - started  # what a request costs on this machine now, on top of its delay
    server.requests.clear()
    server.delay = 1.0
    trainer.args.async_timeout = 1.0 + 3 * sampling + 0.5  # read when train() starts the generator
    trainer.train()
    assert len(_ahead_requests(trainer)) == 6
    assert server.pushes_during_requests == 0
    assert all(torch.isfinite(torch.tensor(logged_metric(trainer, "loss"))))


def test_a_train_after_a_timeout_pushes_no_weights_while_the_left_request_samples(
    server_standin, tiny_model_path, tmp_path
):
    """The first ``train()`` gives up on a request the server takes 2.5 s to answer (``async_timeout=1.5``); the next
    ``train()`` drops what was still queued and pushes its first weights only once the server has answered."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=1, max_steps=3, async_timeout=1.5)
    server = trainer.vllm_generation.vllm_client
    events = []  # ("push" | "request starts" | "request ends", requests in flight)
    load, generate = server.load, server.generate

    def recorded_load(model):
        events.append(("push", server.in_flight))
        load(model)

    def recorded_generate(*args, **kwargs):
        events.append(("request starts", server.in_flight))
        try:
            return generate(*args, **kwargs)
        finally:
            events.append(("request ends", server.in_flight))

    server.load, server.generate = recorded_load, recorded_generate
    server.delay = 2.5
    with pytest.raises(GeneratorError, match=r"generation step 0 within 1\.5 s of its sending"):
        trainer.train()
    server.delay = 0.0  # the request in flight still takes its 2.5 s
    first_run = len(events)
    trainer.train()
    assert [what for what, _ in events[first_run:]][:2] == ["request ends", "push"], events
    assert [in_flight for what, in_flight in events if what == "push"] == [0] * sum(w == "push" for w, _ in events)
    assert server.pushes_during_requests == 0
    assert len([r for r in _ahead_requests(trainer)]) == 1 + 3, "the first run's queued request was sent anyway"


def test_an_interpreter_that_ends_with_a_request_on_the_server_waits_for_it_and_exits_cleanly(
    tiny_model_path, tmp_path
):
    """No request thread runs while Python shuts down: the exit waits for the request the server is sampling."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "ends_with_a_request.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "import trl.trainer.grpo_trainer as trl_grpo\n"
        "from test_async_server import ServerModeGeneration, _trainer, make_prompts\n"
        "from trl_reasoning.async_rollouts.behaviour import trainable_parameters\n"
        "from trl_reasoning.async_rollouts.protocols import GenerationJob, VersionedWeights\n"
        "from pathlib import Path\n"
        "trl_grpo.VLLMGeneration = ServerModeGeneration\n"
        f"trainer = _trainer({tiny_model_path!r}, Path({str(tmp_path / 'out')!r}))\n"
        "server = trainer.vllm_generation.vllm_client\n"
        "server.delay = 2.0\n"
        "generate = server.generate\n"
        "def answered(*args, **kwargs):\n"
        "    output = generate(*args, **kwargs)\n"
        "    print('ANSWERED', flush=True)\n"
        "    return output\n"
        "server.generate = answered\n"
        "prompt_ids = trainer.tokenize_prompts([make_prompts(1)[0]['prompt']] * trainer.num_generations)\n"
        "params = trainable_parameters(trainer.model)\n"
        "weights = VersionedWeights(0, {name: p.detach().clone() for name, p in params.items()})\n"
        "trainer.async_rollouts.pipeline.generator.submit(GenerationJob(0, prompt_ids, weights, seed=0))\n"
        "import time\n"
        "while not server.in_flight:  # on the server, sampling\n"
        "    time.sleep(0.01)\n"
        "print('EXITING', flush=True)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "terminate called" not in result.stderr
    markers = [line for line in result.stdout.splitlines() if line in ("EXITING", "ANSWERED")]
    assert markers == ["EXITING", "ANSWERED"], (result.stdout[-3000:], result.stderr[-3000:])


def test_weights_are_pushed_once_per_version_whatever_object_carries_them(server_standin, tiny_model_path, tmp_path):
    """The server's transport pushes by the weights' version, not by the identity of the dict that carries them: a
    converted copy of the weights on the server pushes nothing, a new version pushes once (after the requests sampled
    with the old one), and after ``release`` (TRL's own sync may have changed the server) the next job pushes again."""
    from trl_reasoning.async_rollouts.behaviour import trainable_parameters
    from trl_reasoning.async_rollouts.protocols import GenerationJob, Generator, VersionedWeights

    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=1, max_steps=4)
    server = trainer.vllm_generation.vllm_client
    pushes = []
    load = server.load

    def counted(model):
        pushes.append(fingerprint(model))
        load(model)

    server.load = counted
    generator = trainer.async_rollouts.pipeline.generator
    assert isinstance(generator, Generator)
    prompt_ids = trainer.tokenize_prompts([make_prompts(1)[0]["prompt"]] * trainer.num_generations)
    weights = {name: p.detach().clone() for name, p in trainable_parameters(trainer.model).items()}
    converted = {name: tensor.double().to(tensor.dtype) for name, tensor in weights.items()}  # new objects
    newer = {name: tensor + 0.01 for name, tensor in weights.items()}
    jobs = [(0, weights), (0, converted), (1, newer), (1, dict(newer))]
    for step, (version, tensors) in enumerate(jobs):
        generator.submit(GenerationJob(step, prompt_ids, VersionedWeights(version, tensors), seed=step))
    assert len(pushes) == 2 and pushes[0] != pushes[1]
    for step in range(len(jobs)):
        generator.result(step)
    assert [r["weights"] for r in _ahead_requests(trainer)] == [pushes[0]] * 2 + [pushes[1]] * 2
    generator.release()
    generator.submit(GenerationJob(4, prompt_ids, VersionedWeights(1, newer), seed=4))
    generator.result(4)
    assert len(pushes) == 3 and pushes[2] == pushes[1]
    assert server.pushes_during_requests == 0
    trainer.async_rollouts.pipeline.close()


def test_a_run_pushes_each_behaviour_version_once(server_standin, tiny_model_path, tmp_path):
    """With k = 2 the batches of steps 0..3 are sampled by the weights of steps 0, 0, 0, 1: two pushes, however many
    objects carry those weights on their way (the live parameters, snapshots)."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=2, max_steps=4)
    server = trainer.vllm_generation.vllm_client
    pushes = []
    load = server.load

    def counted(model):
        pushes.append(fingerprint(model))
        load(model)

    server.load = counted
    timeline = Timeline(trainer)
    trainer.add_callback(timeline)
    trainer.train()
    assert pushes == [timeline.weights[0], timeline.weights[1]]
    assert [r["weights"] for r in _ahead_requests(trainer)] == [timeline.weights[max(g - 2, 0)] for g in range(4)]


def test_a_second_train_samples_ahead_again_as_a_fresh_run(server_standin, tiny_model_path, tmp_path):
    """A notebook's second ``train()``: the batches are sent ahead again (one request per batch from the background
    thread, the lag growing to k), no restart warnings, and the server gets the current weights first."""
    trainer = _trainer(tiny_model_path, tmp_path, max_staleness=2, max_steps=4)
    trainer.train()
    sent_before = len(_ahead_requests(trainer))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        timeline = Timeline(trainer)
        trainer.add_callback(timeline)
        trainer.train()
    requests = _ahead_requests(trainer)[sent_before:]
    assert len(requests) == 4
    assert [r["weights"] for r in requests] == [timeline.weights[max(g - 2, 0)] for g in range(4)]
    assert logged_metric(trainer, "async/staleness") == [0.0, 1.0, 2.0, 2.0]
    assert trainer.vllm_generation.vllm_client.pushes_during_requests == 0
