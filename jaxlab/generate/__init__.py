"""Generation: autoregressive sampling with a KV cache (`sample`), continuous batching (`continuous.generate`), shared
prefixes (`prefix`) and the throughput benchmark."""
from jaxlab.generate.sampling import SampleOutput, sample, trace_count, warp_logits
from jaxlab.generate.bench import bench_generate

__all__ = ["SampleOutput", "sample", "trace_count", "warp_logits", "bench_generate"]
