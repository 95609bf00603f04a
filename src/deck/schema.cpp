// The deck schema: every section and key with its type, default, allowed values, unit and help.
#include <algorithm>
#include <string>
#include <utility>

#include "shardtrain/deck/deck.h"
#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/model_limits.h"

namespace shardtrain::deck {
namespace {

// Fluent builder so each key reads as one line of the schema table.
class Key {
 public:
  Key(const char* key, Type type, Value def, std::string help) {
    s_.key = key;
    s_.type = type;
    s_.default_value = std::move(def);
    s_.help = std::move(help);
  }
  Key& unit(const char* u) { s_.unit = u; return *this; }
  Key& at_least(double v) { s_.has_min = true; s_.min = v; return *this; }
  Key& above(double v) { at_least(v); s_.min_exclusive = true; return *this; }
  Key& at_most(double v) { s_.has_max = true; s_.max = v; return *this; }
  Key& below(double v) { at_most(v); s_.max_exclusive = true; return *this; }
  Key& one_of(std::vector<std::string> c) { s_.choices = std::move(c); return *this; }
  Key& non_empty() { s_.non_empty = true; return *this; }
  Key& inside(const char* base) { s_.inside = base; return *this; }
  operator KeySpec() const { return s_; }

 private:
  KeySpec s_;
};

Key Int(const char* key, int64_t def, const char* help) { return Key(key, Type::Int, def, help); }
Key Float(const char* key, double def, const char* help) { return Key(key, Type::Float, def, help); }
Key Bool(const char* key, bool def, const char* help) { return Key(key, Type::Bool, def, help); }
Key Str(const char* key, const char* def, std::string help) {
  return Key(key, Type::String, std::string(def), std::move(help));
}
Key List(const char* key, std::vector<std::string> def, const char* help) {
  return Key(key, Type::StringList, std::move(def), help);
}

const std::vector<std::string> kDtypes = choices::as_list(choices::kDtypes);
using limits::max_of;  // the model sizes' ranges: util/model_limits.h

std::vector<KeySpec> build_schema() {
  return {
    // [run]
    Str("run.name", "quickstart", "run name; the default output directory is runs/<name> (a relative path that stays inside runs/)").non_empty().inside("runs/"),
    Int("run.seed", 1234, "seed of parameter init, data order and dropout").at_least(0),
    Str("run.out_dir", "", "output directory (metrics, resolved deck, checkpoints); \"\" = runs/<run.name>"),
    Int("run.threads", 0,
        "intra-op CPU threads per rank; 0 = cores per host / ranks per host; at most 4 x the host's CPUs "
        "(checked when the run starts)")
        .at_least(0).at_most(kMaxThreads).unit("threads"),
    Str("run.device", "auto",
        "where each rank computes: auto = its GPU when libtorch has CUDA and every rank has a GPU of its own, "
        "else the CPU; cuda = its GPU (an error without one); cpu")
        .one_of(choices::as_list(choices::kDevices)),
    Bool("run.reuse_host_memory", true,
         "keep freed host memory in the process for the next step's allocations (glibc: no mmap for large "
         "blocks, no trimming) instead of returning it and faulting it in again each step; resident memory "
         "then stays at the heap's high-water mark; false = glibc's defaults"),

    // [parallel]
    Str("parallel.strategy", "full_shard", "how parameters, gradients and optimizer state are sharded")
        .one_of(choices::as_list(choices::kStrategies)),
    Int("parallel.shard_group_size", 0,
        "ranks that share one sharded replica (must divide the world size); 0 = ranks per host")
        .at_least(0).at_most(kMaxRanks).unit("ranks"),
    Str("parallel.replica_sync", "every_step",
        "how the replicas of hybrid_shard / hybrid_shard_zero2 (one per shard group) stay in step: every_step "
        "= gradients averaged across replicas every optimizer step; diloco = nothing crosses between replicas "
        "for diloco.inner_steps steps, then the change of each replica's shard is averaged and applied by an "
        "outer SGD with Nesterov momentum (DiLoCo; the [diloco] section)")
        .one_of(choices::as_list(choices::kReplicaSync)),
    Int("parallel.simulate_ranks_per_host", 0,
        "pretend every k consecutive ranks form a host (tests on one machine; the last host holds the rest "
        "when k does not divide the world size); 0 = real hosts")
        .at_least(0).at_most(kMaxRanks).unit("ranks"),

    // [comm]
    Str("comm.backend", "auto", "collective backend; auto = nccl for CUDA tensors, mpi otherwise")
        .one_of(choices::as_list(choices::kBackends)),
    Float("comm.timeout_s", 600.0, "a collective that takes longer aborts the job with a report")
        .above(0).at_most(1e6).unit("s"),
    Int("comm.flight_recorder", 64, "collectives remembered per group for timeout reports; 0 = off")
        .at_least(0).at_most(65536).unit("entries"),

    // [model]
    // The allowed values of model.arch and model.preset are the model layer's (its architecture
    // table and presets), which sits above this one: the program supplies them at start-up
    // (set_choices, from train::register_model_choices); without that, any name reaches the model
    // layer, which refuses an unknown one itself.
    Str("model.arch", "gpt2", "model family"),
    Str("model.preset", "", "named size that fills the model keys this deck does not set; \"\" = none"),
    Int("model.vocab_size", 50257, "vocabulary size (gpt2, llama)").at_least(1).at_most(max_of("vocab_size")).unit("tokens"),
    Int("model.seq_len", 1024, "context length (gpt2, llama)").at_least(1).at_most(max_of("seq_len")).unit("tokens"),
    Int("model.d_model", 768, "hidden size").at_least(1).at_most(max_of("d_model")),
    Int("model.n_layers", 12, "transformer blocks").at_least(1).at_most(max_of("n_layers")),
    Int("model.n_heads", 12, "attention heads; must divide d_model").at_least(1).at_most(max_of("n_heads")),
    Int("model.n_kv_heads", 0, "key/value heads for grouped-query attention (llama); 0 = n_heads")
        .at_least(0).at_most(max_of("n_kv_heads")),
    Int("model.d_ff", 0, "feed-forward hidden size; 0 = arch default (gpt2 4*d_model, llama SwiGLU)")
        .at_least(0).at_most(max_of("d_ff")),
    Float("model.norm_eps", 1e-5, "epsilon of the layer / RMS norms").above(0).at_most(1),
    Float("model.rope_theta", 10000.0, "rotary embedding base (llama)").above(0),
    Bool("model.tie_embeddings", true, "share the token embedding with the output projection (gpt2 always ties)"),
    Int("model.image_size", 28, "input image side (vit)").at_least(1).at_most(max_of("image_size")).unit("pixels"),
    Int("model.patch_size", 7, "patch side; must divide image_size (vit)").at_least(1).at_most(max_of("patch_size")).unit("pixels"),
    Int("model.channels", 1, "input image channels (vit)").at_least(1).at_most(max_of("channels")),
    Int("model.num_classes", 10, "output classes (vit)").at_least(1).at_most(max_of("num_classes")),
    Float("model.dropout", 0.0, "dropout probability").at_least(0).below(1),
    Str("model.from_hf", "",
        "Hugging Face model directory (or its config.json) whose config fills the model: LlamaForCausalLM, "
        "MistralForCausalLM or Qwen2ForCausalLM (arch llama); a model key this deck sets must agree with it, "
        "except seq_len (the training context, at most max_position_embeddings) and dropout; checkpoint.init_from "
        "= a directory with a config.json does the same; \"\" = none"),
    Int("model.head_dim", 0, "width of one attention head (llama); 0 = d_model / n_heads").at_least(0).at_most(max_of("head_dim")),
    Bool("model.attention_bias", false, "biases on the q, k, v and o projections (llama; Hugging Face attention_bias)"),
    Bool("model.qkv_bias", false, "biases on the q, k and v projections only (llama; Qwen2)"),
    Bool("model.mlp_bias", false, "biases on the gate, up and down projections (llama; Hugging Face mlp_bias)"),
    Str("model.rope_scaling", "default",
        "rotary frequency scaling (llama), as transformers' rope_type: default; linear (frequencies / rope_factor); "
        "llama3 (Llama 3.1: rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions)")
        .one_of({"default", "linear", "llama3"}),
    Float("model.rope_factor", 1.0, "rope_scaling linear / llama3: the scaling factor").above(0).at_most(1e6),
    Float("model.rope_low_freq_factor", 1.0, "rope_scaling llama3: low_freq_factor").above(0).at_most(1e6),
    Float("model.rope_high_freq_factor", 4.0, "rope_scaling llama3: high_freq_factor").above(0).at_most(1e6),
    Int("model.rope_original_max_positions", 8192, "rope_scaling llama3: original_max_position_embeddings")
        .at_least(1).at_most(max_of("rope_original_max_positions")).unit("tokens"),
    Int("model.max_positions", 0,
        "longest sequence the model is made for (llama; Hugging Face max_position_embeddings); seq_len may not "
        "exceed it; 0 = seq_len")
        .at_least(0).at_most(max_of("max_positions")).unit("tokens"),
    Int("model.sliding_window", 0,
        "attention window of Mistral / Qwen2 (llama); windowed attention is not implemented, so seq_len may not "
        "exceed it; 0 = none")
        .at_least(0).at_most(max_of("sliding_window")).unit("tokens"),
    Str("model.hf_architecture", "",
        "Hugging Face class of the model (llama), written to an exported config.json; \"\" = from the options "
        "(Qwen2 with qkv_bias, Mistral with sliding_window, else Llama)")
        .one_of({"", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}),
    Str("model.bos_token_id", "", "beginning-of-sequence token id(s) as in config.json (\"1\", \"[1, 2]\"; llama); \"\" = none"),
    Str("model.eos_token_id", "", "end-of-sequence token id(s) as in config.json (\"2\", \"[128001, 128009]\"; llama); \"\" = none"),
    Str("model.torch_dtype", "", "dtype the source weights were saved in (config.json torch_dtype; the default of "
        "ckpt export --format hf); \"\" = not given")
        .one_of({"", "float32", "bfloat16", "float16"}),

    // [fsdp]
    Str("fsdp.param_dtype", "fp32", "dtype of unsharded parameters in forward and backward").one_of(kDtypes),
    Str("fsdp.bf16_gemm", "auto", "CPU GEMMs of bf16 linear layers: libtorch's bf16 matmul (oneDNN, AMX where present), an fp32 GEMM on the bf16 operands, or the faster of the two measured once per CPU model")
        .one_of({"auto", "bf16", "fp32"}),
    Str("fsdp.reduce_dtype", "fp32", "dtype in which gradients are reduced").one_of(kDtypes),
    Str("fsdp.buffer_dtype", "fp32", "dtype of module buffers").one_of(kDtypes),
    Str("fsdp.wrap", "block", "which modules become FSDP units: each block, by size, or the whole model")
        .one_of(choices::as_list(choices::kWrapPolicies)),
    Int("fsdp.min_num_params", 100000000, "wrap = size: smallest module that becomes its own unit")
        .at_least(1).unit("params"),
    List("fsdp.keep_fp32", {"norm", "ln_"}, "parameter-name patterns kept in fp32 under mixed precision"),
    List("fsdp.ignored_params", {}, "parameter-name patterns left unsharded (replicated, all-reduced like DDP)"),
    Str("fsdp.backward_prefetch", "pre", "when backward gathers the next unit: before or after the current gradient")
        .one_of(choices::as_list(choices::kBackwardPrefetch)),
    Bool("fsdp.forward_prefetch", false, "gather the next unit while the current one runs forward"),
    Int("fsdp.limit_all_gathers", 2, "all-gathers in flight at most (bounds unsharded memory)")
        .at_least(1).at_most(1024).unit("all-gathers"),
    Bool("fsdp.activation_checkpointing", false, "recompute each unit's activations in backward"),
    Bool("fsdp.cpu_offload", false, "keep parameter shards and optimizer state in host memory"),
    Bool("fsdp.quantize_weights", false,
         "ZeRO++ qwZ: the weight all-gather moves int8 codes with one fp32 scale per fsdp.quant_block values, "
         "dequantized into param_dtype on every rank; fp32 masters are never quantized (not with no_shard or "
         "cpu_offload)"),
    Bool("fsdp.quantize_grads", false,
         "ZeRO++ qgZ: hybrid strategies average gradient shards across replicas (between nodes) in int8 with "
         "per-block scales and error feedback (the residual is checkpointed), summed in fp32; inside the node "
         "the reduce-scatter stays in reduce_dtype (not with other strategies or cpu_offload)"),
    Bool("fsdp.secondary_shards", false,
         "ZeRO++ hpZ (FSDP2's reshard_after_forward = <node size>): full_shard keeps, after each unit's forward, "
         "a secondary shard of its param_dtype weights over the ranks of the node (parallel.shard_group_size), so "
         "the backward all-gather stays inside the node; costs padded unit bytes / node size per unit until its "
         "backward (in the plan); exact (the weights forward used); full_shard only"),
    Int("fsdp.quant_block", 256, "values per quantization block of quantize_weights / quantize_grads (one fp32 "
        "scale each: 4/block bytes per value on top of the int8 code)")
        .at_least(8).at_most(1 << 20).unit("values"),
    Int("fsdp.quant_guard_every", 50,
        "accuracy guard of the quantized collectives: every k optimizer steps (step 0 included) also compute "
        "the exact result, log the relative error (metrics quant_weight_err / quant_grad_err) and fall a unit "
        "back to full precision, with a warning, when it exceeds quant_guard_threshold; DiLoCo's int8 / int4 "
        "outer average: every k-th sync of a fragment (outer_quant_err; the fragment falls back to fp32); 0 = off")
        .at_least(0).unit("steps"),
    Float("fsdp.quant_guard_threshold", 0.05,
          "relative L2 error of a unit's gathered weights or averaged gradient above which the guard falls "
          "that unit back to full precision")
        .above(0),

    // [diloco]
    Int("diloco.inner_steps", 100,
        "H: optimizer steps each replica takes on its own between two outer steps")
        .at_least(1).at_most(1000000).unit("steps"),
    Float("diloco.outer_lr", 0.7,
          "learning rate of the outer SGD on the averaged outer gradient; 0.7 with momentum 0.9 are the DiLoCo "
          "paper's (8 replicas, H = 500); with 2 replicas 1.0 with momentum 0.5 measured better (perf/README.md, "
          "DiLoCo)")
        .above(0).at_most(100),
    Float("diloco.outer_momentum", 0.9,
          "momentum of the outer SGD; 0 = none; at small H (10) 0.9 can stall training: it multiplies aligned "
          "outer gradients up to 1 / (1 - momentum) times")
        .at_least(0).below(1),
    Bool("diloco.nesterov", true, "Nesterov momentum in the outer step (false = heavy ball)"),
    Int("diloco.fragments", 1,
        "streaming DiLoCo: the units split into this many fragments, fragment f synchronised at its own "
        "offset f * inner_steps / fragments of the cycle; 1 = the whole model at once")
        .at_least(1).at_most(4096).unit("fragments"),
    Int("diloco.overlap_steps", 0,
        "streaming DiLoCo: inner steps that run while a fragment's outer gradients are in flight; the outer "
        "step is applied that many steps later (0 = wait for it)")
        .at_least(0).unit("steps"),
    Str("diloco.outer_dtype", "fp32",
        "wire format of the outer gradients between replicas: fp32, bf16, or int8 / int4 codes with one fp32 "
        "scale per fsdp.quant_block values (summed in fp32), under fsdp.quant_guard_every's accuracy guard")
        .one_of(choices::as_list(choices::kOuterDtypes)),

    // [lora]
    Int("lora.rank", 0,
        "LoRA (Hugging Face PEFT's semantics): the adapters' rank r; each target gets y = W x + s B(A(dropout(x))), "
        "A [r, in] Kaiming-uniform, B [out, r] zero, and only the adapters (and lora.train_also) train; the base is "
        "frozen (train.freeze's storage); at most min(in, out) of every target; 0 = off")
        .at_least(0).at_most(1 << 16),
    Float("lora.alpha", 8.0, "LoRA's alpha: the scale s = alpha / rank (alpha / sqrt(rank) with lora.rslora)")
        .above(0).at_most(1e6),
    Float("lora.dropout", 0.0, "dropout on the adapters' input (PEFT's lora_dropout)").at_least(0).below(1),
    List("lora.targets", {},
         "the linear layers that get adapters: module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
         "down_proj; GPT-2's c_attn, c_proj, c_fc), a dotted suffix of a module path, a glob over module paths, or "
         "\"all-linear\" (every linear layer of the blocks); [] = the architecture's PEFT default (llama: q_proj, v_proj; "
         "gpt2: c_attn)"),
    Bool("lora.rslora", false, "rank-stabilised LoRA: the scale is alpha / sqrt(rank) instead of alpha / rank"),
    Str("lora.init_from", "",
        "a PEFT adapter directory (adapter_config.json + adapter_model.safetensors, e.g. from the hub or `ckpt export "
        "--format peft`) whose adapters start a fresh run; its rank, targets and scale must be this deck's; "" = "
        "PEFT's initialisation from run.seed"),
    Str("lora.base_dtype", "param_dtype",
        "how the frozen base's linear weights in the blocks are stored (QLoRA): param_dtype (as fsdp.param_dtype), or "
        "nf4: bitsandbytes' 4-bit NormalFloat codes, one fp32 absmax per lora.nf4_block values, sharded and all-gathered "
        "as codes and dequantized into fsdp.param_dtype for compute; embeddings, norms, the head and biases stay in "
        "fsdp.param_dtype. Needs lora.rank > 0")
        .one_of({"param_dtype", "nf4"}),
    Int("lora.nf4_block", 64,
        "lora.base_dtype = \"nf4\": values per quantization block (bitsandbytes' blocksize): a power of two from 32 to "
        "4096; every tensor starts at a block boundary of its flat, the flat is padded to the shard count times the block")
        .at_least(32).at_most(4096),
    Bool("lora.nf4_double_quant", false,
         "lora.base_dtype = \"nf4\": the absmax values quantized again to 8 bits (bitsandbytes' compress_statistics, "
         "QLoRA's double quantization; blocks of 256): 0.127 instead of 0.5 bits per parameter for the statistics"),
    List("lora.train_also", {},
         "parameter-name patterns trained beside the adapters, in full (PEFT's modules_to_save, e.g. \"norm\"): "
         "their fp32 masters and optimizer state are kept and they are in the adapter checkpoints and exports"),

    // [optimizer]
    Str("optimizer.name", "adamw", "optimizer").one_of(choices::as_list(choices::kOptimizers)),
    Float("optimizer.lr", 3e-4, "peak learning rate").above(0).at_most(1e6),
    Float("optimizer.beta1", 0.9, "adamw: first-moment decay").at_least(0).below(1),
    Float("optimizer.beta2", 0.95, "adamw: second-moment decay").at_least(0).below(1),
    Float("optimizer.eps", 1e-8, "adamw: denominator epsilon").above(0).at_most(1),
    Float("optimizer.weight_decay", 0.1, "decoupled weight decay").at_least(0),
    Float("optimizer.momentum", 0.9, "sgd: momentum").at_least(0).below(1),
    Float("optimizer.grad_clip", 1.0, "clip the global gradient norm to this; 0 = off").at_least(0),
    List("optimizer.no_decay", {".bias", "norm", "ln_"}, "parameter-name patterns without weight decay"),
    Int("optimizer.host_threads", 0,
        "threads of the optimizer step on host-memory shards (CPU runs, fsdp.cpu_offload); the result does not "
        "depend on it; 0 = the rank's CPU threads (run.threads); at most 4 x the host's CPUs (checked when the run "
        "starts)")
        .at_least(0).at_most(kMaxThreads).unit("threads"),

    // [lr]
    Str("lr.schedule", "cosine", "learning-rate decay after warmup").one_of({"constant", "cosine", "linear"}),
    Int("lr.warmup_steps", 100, "linear warmup from 0 to optimizer.lr").at_least(0).unit("steps"),
    Float("lr.min_lr", 0.0, "learning rate at the end of the decay").at_least(0).at_most(1e6),
    Int("lr.decay_steps", 0, "step at which the decay reaches min_lr; 0 = train.max_steps")
        .at_least(0).unit("steps"),

    // [train]
    Int("train.max_steps", 1000, "optimizer steps to run").at_least(1).unit("steps"),
    Int("train.max_tokens", 0, "stop after this many training tokens; 0 = no limit").at_least(0).unit("tokens"),
    Int("train.micro_batch", 8, "samples per rank in one forward/backward").at_least(1).at_most(1 << 20).unit("samples"),
    Int("train.global_batch", 0,
        "samples per optimizer step over all ranks; 0 = micro_batch * grad_accum * data-parallel ranks")
        .at_least(0).at_most(int64_t{1} << 40).unit("samples"),
    Int("train.grad_accum", 0, "micro-batches per optimizer step; 0 = derived from global_batch (or 1)")
        .at_least(0).at_most(1 << 20).unit("micro-batches"),
    Bool("train.reproducible", false,
         "the same bits at every power-of-two world size and strategy, and across a resume at another one: the "
         "global batch is split into train.global_batch / train.micro_batch leaves (a power of two, set "
         "train.global_batch), whose gradients are summed in one fixed binary tree; the gradient norm is summed "
         "exactly; dropout is keyed by the leaf; threads per rank default to 1. Needs comm.backend mpi and "
         "fsdp.reduce_dtype fp32; see docs/reproducibility.md"),
    List("train.freeze", {},
         "parameter-name patterns that do not train (a partial fine-tune): kept sharded in fsdp.param_dtype, with "
         "no gradient, fp32 master or optimizer state, only gathered; a pattern with *, ? or [ is a glob over the "
         "whole name (\"model.layers.[0-9].*\"), any other matches where it occurs (\"embed_tokens\")"),
    Int("train.val_every", 100, "validate every this many steps; 0 = never").at_least(0).unit("steps"),
    Int("train.val_batches", 10, "global batches of the validation split per evaluation (in order)").at_least(1).unit("batches"),
    Str("train.on_nonfinite", "stop",
        "a step whose loss or gradient norm is NaN/Inf: stop (exit 4, no checkpoint of that state, the last good "
        "one kept), skip_step (no optimizer update for that batch; the step still counts), or continue (train on; "
        "non-finite states are never checkpointed and the run ends with exit 4)")
        .one_of({"stop", "skip_step", "continue"}),
    Int("train.max_skipped_steps", 10,
        "with on_nonfinite = skip_step: stop (exit 4) when this many steps in a row were non-finite")
        .at_least(1).unit("steps"),
    Int("train.sample_every", 0,
        "print a text sample (and append it to <run.out_dir>/samples.jsonl) every this many steps and at the "
        "last step; 0 = never; language models only").at_least(0).unit("steps"),
    Str("train.sample_prompt", "",
        "text the samples continue; \"\" = a new document (the end-of-text token; a newline for the byte tokenizer)"),
    Int("train.sample_tokens", 64, "tokens per sample").at_least(1).at_most(4096).unit("tokens"),
    Float("train.sample_temperature", 0.8, "sampling temperature; 0 = greedy").at_least(0).at_most(100),
    Int("train.sample_top_k", 40, "sample among the k most likely tokens; 0 = all").at_least(0),

    // [data]
    Str("data.dataset", "",
        "prepared dataset directory (shardtrain data prepare); \"\" = synthetic items drawn from run.seed "
        "(uniform tokens, or N(0,1) images for vit; no validation): throughput and scaling runs"),
    Str("data.tokenizer", choices::kTokenizers[0],
        "tokenizer that produced the tokens: " + choices::joined(choices::kTokenizers) +
            ", or a model's tokenizer.json / tokenizer.model / model directory, spelled as given to data "
            "prepare; when set, a token dataset made with another is an error"),
    Float("data.val_fraction", 0.05,
          "validation fraction the dataset was prepared with (`data prepare --val-fraction`); when set, a "
          "dataset split otherwise is an error")
        .at_least(0).at_most(0.5),
    Str("data.packing", choices::kPackingAuto,
        "how a token split becomes windows of model.seq_len: stream (windows cut through the token stream), "
        "packed (whole rows placed into windows, first-fit decreasing, each row computed as if alone: its own "
        "causal attention, positions from 0, no target across its end), padded (one row per window, batches "
        "padded to their longest row); auto = packed for instruction data (a dataset with a loss mask), stream "
        "otherwise. packed and padded need a dataset with row boundaries (data prepare of this version)")
        .one_of([] {
          std::vector<std::string> v = choices::as_list(choices::kPackings);
          v.insert(v.begin(), choices::kPackingAuto);
          return v;
        }()),
    Bool("data.document_mask", false,
         "with data.packing = \"stream\": windows still cut through documents, but attention and positions restart "
         "at each document start inside a window, and a document's last token predicts nothing (Llama 3's "
         "pretraining); needs row boundaries"),
    Str("data.overlong", choices::kOverlong[0],
        "packed / padded: a row longer than model.seq_len keeps its first seq_len tokens (truncate, as TRL's "
        "max_length; the start of train reports how many rows and tokens this drops), or is an error naming its "
        "source line (error)")
        .one_of(choices::as_list(choices::kOverlong)),

    // [log]
    Int("log.every", 10, "print and record metrics every this many steps").at_least(1).unit("steps"),
    Str("log.metrics_file", "metrics.jsonl", "JSON-lines metrics file, relative to run.out_dir and inside it (no absolute path, no ..); \"\" = none").inside("run.out_dir"),
    Float("log.peak_tflops", 0.0, "peak throughput per rank for MFU (a GPU's datasheet figure); 0 = the CPU's theoretical peak, or a matmul measured at start where that is higher")
        .at_least(0).at_most(1e9).unit("TFLOP/s"),
    Bool("log.print_deck", false,
         "train prints the whole resolved deck (every key) at start; false: a short summary (the keys the deck and "
         "--set give) and the path of <run.out_dir>/deck.resolved.toml, which always holds it"),

    // [checkpoint]
    Str("checkpoint.dir", "", "checkpoint directory; \"\" = <run.out_dir>/checkpoints"),
    Int("checkpoint.every_steps", 0, "write a checkpoint every this many steps; 0 = off").at_least(0).unit("steps"),
    Float("checkpoint.every_minutes", 0.0, "write a checkpoint every this many minutes; 0 = off")
        .at_least(0).at_most(1e6).unit("min"),
    Int("checkpoint.keep_last", 3,
        "checkpoints of this run kept (the newest that verified); older ones of this run are deleted, other runs' never")
        .at_least(1).at_most(1 << 20),
    Str("checkpoint.resume", "auto", "auto = latest in checkpoint.dir if any, never, or a checkpoint path")
        .non_empty(),
    Bool("checkpoint.allow_data_change", false,
         "resume even when data.dataset differs from the data the checkpoint was trained on (files, sizes or "
         "content changed); false = exit 2 naming what changed; true = a warning in the log and the metrics"),
    Bool("checkpoint.async", false, "write checkpoints in the background while training continues"),
    Str("checkpoint.previous_run", "error",
        "a run that starts fresh (resume = never, or a checkpoint of another run) where checkpoint.dir holds "
        "another run's checkpoints: error (exit 2; nothing touched), or move_aside (that run's checkpoints and "
        "metrics move into previous-runs/<its run id>/ first)")
        .one_of({"error", "move_aside"}),
    Str("checkpoint.init_from", "",
        "safetensors file, Hugging Face index .json or model directory whose weights start a fresh run "
        "(fine-tuning; F32/BF16/F16); each rank reads only its shards; "
        "ignored when resuming; \"\" = initialise from run.seed"),
  };
}

}  // namespace

const char* to_string(Type t) {
  switch (t) {
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::Bool: return "bool";
    case Type::String: return "string";
    case Type::StringList: return "string list";
  }
  return "?";
}

const std::vector<SectionSpec>& sections() {
  static const std::vector<SectionSpec> s = {
      {"run", "what the run is called, where it writes, how it seeds"},
      {"parallel", "sharding strategy and the shape of the device mesh"},
      {"comm", "collective communication"},
      {"model", "architecture and size"},
      {"fsdp", "units, mixed precision, prefetching, memory savers"},
      {"diloco", "semi-synchronous replicas (parallel.replica_sync = \"diloco\"): the outer step"},
      {"lora", "LoRA adapters (Hugging Face PEFT's semantics): low-rank fine-tuning of a frozen base"},
      {"optimizer", "the optimizer stepping the parameter shards"},
      {"lr", "learning-rate schedule"},
      {"train", "length of the run and batch sizes"},
      {"data", "training and validation data"},
      {"log", "console and metrics output"},
      {"checkpoint", "sharded HDF5 checkpoints and resuming"},
  };
  return s;
}

namespace {
std::vector<KeySpec>& mutable_schema() {
  static std::vector<KeySpec> s = build_schema();
  return s;
}
}  // namespace

const std::vector<KeySpec>& schema() { return mutable_schema(); }

void set_choices(const std::string& key, std::vector<std::string> choices) {
  auto& s = mutable_schema();
  auto it = std::find_if(s.begin(), s.end(), [&](const KeySpec& k) { return k.key == key; });
  ST_CHECK(it != s.end() && it->type == Type::String, "set_choices: no string key '", key, "' in the schema");
  it->choices = std::move(choices);
}

const KeySpec* find_key(const std::string& key) {
  const auto& s = schema();
  auto it = std::find_if(s.begin(), s.end(), [&](const KeySpec& k) { return k.key == key; });
  return it == s.end() ? nullptr : &*it;
}

}  // namespace shardtrain::deck
