"""Human-readable output of a compile: the legacy messages, a rich table, ``report.txt``."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from csrun.cluster import cluster_info
from csrun.compiler.placement import Plan
from csrun.compiler.result import CompileResult
from csrun.consoles import console as log_console
from csrun.consoles import time_prefix

MSG_COMPILING = "Compiling the model. This may take a few minutes."
MSG_TRAIN_OK = "Compile for training completed successfully!"
MSG_EVAL_OK = "Compile for evaluation completed successfully!"
MSG_VALIDATE_OK = "Validation completed successfully!"
MSG_FAILED = "Compile failed"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def plan_table(plan: Plan, *, top: int = 10) -> Table:
    """The biggest layers with their regions, memory and stage times (estimates)."""
    mode, what = (", weight streaming", "layer groups, one at a time") if plan.streaming else ("", "layers")
    t = Table(title=f"Placement on {plan.wafer.name}{mode} (estimate) - biggest "
                    f"{min(top, len(plan.layers))} of {len(plan.layers)} {what}")
    for col, just in (("layer", "left"), ("type", "left"), ("PEs", "right"), ("weights", "right"),
                      ("opt. state", "right"), ("activations", "right"), ("SRAM need/avail", "right"),
                      ("MFLOP/sample", "right"), ("stage µs", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for l in plan.biggest_layers(top):
        t.add_row(l.name, l.module_type.rsplit(".", 1)[-1], f"{l.pes:,}", human_bytes(l.weight_bytes),
                  human_bytes(l.optimizer_state_bytes), human_bytes(l.activation_bytes),
                  f"{human_bytes(l.sram_needed_bytes)} / {human_bytes(l.sram_available_bytes)}"
                  + ("" if l.fits else " ✗"),
                  f"{l.train_flops_per_sample / 1e6:,.2f}", f"{l.stage_seconds_per_sample * 1e6:,.3f}")
    return t


def summary_lines(plan: Plan) -> list[str]:
    """Mode and why, fit, utilization and throughput, each figure labelled as an estimate."""
    fit = "fits" if plan.fits else "DOES NOT FIT"
    lines = [
        f"Execution strategy: {plan.execution_strategy} - {plan.why}",
        f"Wafer: {plan.wafer.name}, {plan.wafer.num_pes:,} PEs, {human_bytes(plan.wafer.sram_bytes)} SRAM",
    ]
    if not plan.streaming:
        memory = f"Memory (estimate): {human_bytes(plan.sram_needed_bytes)} needed of {human_bytes(plan.sram_available_bytes)} - {fit}"
        if not plan.fits:  # a placement that overflows the wafer has no utilization or throughput to speak of
            return lines + [memory, f"Utilization and throughput: not estimated (the model needs "
                                    f"{plan.sram_needed_bytes / plan.sram_available_bytes:,.1f}x the wafer's SRAM)"]
        return lines + [
            memory,
            f"Utilization (estimate): {plan.total_utilization:.1%} of PEs placed, {plan.compute_utilization:.1%} of assumed peak FLOP/s",
            f"Throughput (estimate, an upper bound: ideally balanced pipeline): {plan.est_samples_per_sec:,.1f} samples/s "
            f"steady state (slowest stage: {plan.bottleneck})",
        ]
    mx = plan.memoryx
    if mx is not None:
        lines.append(f"{mx.name} (assumed): {human_bytes(plan.memoryx_needed_bytes)} needed of {human_bytes(mx.capacity_bytes)}; "
                     f"weights stream in at {mx.weight_bandwidth_bytes_per_s / 1e9:,.0f} GB/s, gradients out at "
                     f"{mx.gradient_bandwidth_bytes_per_s / 1e9:,.0f} GB/s, {mx.stream_bytes_per_weight} bytes per element")
    return lines + [
        *cluster_lines(plan, cluster_info().num_csx),
        f"Memory (estimate): {human_bytes(plan.sram_needed_bytes)} resident at once of {human_bytes(plan.sram_available_bytes)} "
        f"(a layer group, the next group's weights, {plan.micro_batch_size} of {plan.batch_size} samples' activations) - {fit}",
        f"Streamed per step (estimate): {human_bytes(plan.weight_stream_bytes_per_step)} of weights in, "
        f"{human_bytes(plan.gradient_stream_bytes_per_step)} of gradients out",
        f"Utilization (estimate): {plan.compute_utilization:.1%} of assumed peak FLOP/s",
        f"Throughput (estimate, streaming overlapped with compute): {plan.est_samples_per_sec:,.2f} samples/s "
        f"(slowest layer group: {plan.bottleneck})",
    ]


def cluster_lines(plan: Plan, num_csx: int) -> list[str]:
    """The cluster's plan for a weight-streaming program on ``num_csx`` > 1 systems (none for one):
    the global batch, what SwarmX moves per step and the cluster's throughput, as estimates."""
    if num_csx <= 1 or plan.memoryx is None:
        return []
    mx = plan.memoryx
    w, g = plan.weight_stream_bytes_per_step, plan.gradient_stream_bytes_per_step
    seconds = max(w / mx.weight_bandwidth_bytes_per_s, g / mx.gradient_bandwidth_bytes_per_s)
    return [
        f"Cluster (estimate): {num_csx} systems x {plan.batch_size} samples = {num_csx * plan.batch_size} samples a step; "
        f"SwarmX broadcasts {human_bytes(w)} of weights to each system and sums their {human_bytes(g)} of gradients, "
        f"so MemoryX streams {human_bytes(w)} out and {human_bytes(g)} in a step whatever the number of systems "
        f"({seconds * 1e6:,.1f} µs at its bandwidths); up to {num_csx * plan.est_samples_per_sec:,.2f} samples/s "
        f"({num_csx} x one system's)",
    ]


def _text_table(plan: Plan, top: int) -> list[str]:
    header = ("layer", "type", "PEs", "weights", "opt. state", "activations", "SRAM need", "SRAM avail", "MFLOP/sample", "stage us")
    rows = [header]
    for l in plan.biggest_layers(top):
        rows.append((l.name, l.module_type.rsplit(".", 1)[-1], f"{l.pes:,}", human_bytes(l.weight_bytes),
                     human_bytes(l.optimizer_state_bytes), human_bytes(l.activation_bytes),
                     human_bytes(l.sram_needed_bytes), human_bytes(l.sram_available_bytes),
                     f"{l.train_flops_per_sample / 1e6:,.2f}", f"{l.stage_seconds_per_sample * 1e6:,.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def report_text(result: CompileResult) -> str:
    """The content of ``report.txt`` (plain text)."""
    out = [f"csrun compile report - {result.directory}",
           "All placement and throughput figures are ESTIMATES from the wafer model (csrun.compiler.wafer)."]
    if result.spec is not None:
        opt = result.spec.optimizer
        out.append(f"Mode: {result.spec.mode}; precision: {result.spec.precision}; "
                   f"optimizer: {opt.type if opt else '-'} {opt.hyperparameters if opt else ''}; "
                   f"learning_rate: {result.spec.learning_rate!r}")
        out.append("Inputs: " + ", ".join(f"{i.path} {i.dtype}{list(i.shape)}" for i in result.spec.inputs))
    if result.plan is not None:
        out += summary_lines(result.plan)
        out.append(f"Biggest {min(25, len(result.plan.layers))} of {len(result.plan.layers)} layers by SRAM:")
        out += _text_table(result.plan, 25)
    out.append(f"Capture (torch.export): {result.capture_seconds:.2f} s; whole compile: {result.seconds:.2f} s")
    out.append("program.pt2 holds the graph with shape-only weight placeholders; a run takes the weight values "
               "from the model or checkpoint.")
    return "\n".join(out) + "\n"


def print_result(result: CompileResult, console: Console | None = None) -> None:
    """Print the outcome as users knew it: table, summary, then the legacy success/failure line
    (off a terminal each line after the time of day, the table as it is)."""
    console = console or log_console()
    stamp = time_prefix(console.file)

    def say(line: str) -> None:
        console.print(stamp + line, markup=False, highlight=False)

    if result.plan is not None:
        console.print(plan_table(result.plan))
        for line in summary_lines(result.plan):
            say(line)
    if result.cache_hit:
        say(f"Reusing the compile in {result.directory} (same graph, settings and csrun version).")
    elif result.directory:
        say(f"Compile artifacts written to {result.directory}")
    if result.ok:
        if result.validate_only:
            say(MSG_VALIDATE_OK)
        else:
            say(MSG_EVAL_OK if result.spec is not None and result.spec.mode == "eval" else MSG_TRAIN_OK)
    else:
        for i, p in enumerate(result.problems, 1):
            say(f"[{i}] {type(p).__name__}: {p.render()}")
        say(MSG_FAILED)
