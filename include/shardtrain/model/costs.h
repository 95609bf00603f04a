// What a model allocates per micro-batch beyond its parameters (what autograd saves for backward,
// what backward works in) and the FLOPs it does: the per-architecture input of the memory planner
// (src/plan/memory.cpp, docs/memory-planner.md "Activations"). Each architecture reports its own
// (Model::activation_bytes in gpt2.cpp, llama.cpp, vit.cpp), composed from the per-layer costs
// below, which layers.cpp defines next to the layers' forwards.
//
// Derived by reading the forwards and counting what each op saves (libtorch 1.13: ops save an
// input only when the other input needs its gradient; `mean` saves its input, `sum` does not;
// matmul copies a non-contiguous [B, H, T, hd] operand before bmm and bmm saves the copy), then
// checked tensor by tensor against the counting allocator. Notation: n tokens per micro-batch,
// d model width, f MLP width, H heads, T attention length, V vocabulary, b bytes of the compute
// dtype; "attn" = B*H*T*T elements.
#pragma once
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace shardtrain::model {

// How one micro-batch runs, as far as its memory is concerned.
struct CostQuery {
  int64_t micro_batch = 1;                    // samples per forward
  at::ScalarType compute_dtype = at::kFloat;  // dtype of the unsharded parameters and the computation
  std::vector<std::string> keep_fp32;         // parameter-name patterns kept fp32 under mixed precision
  int threads = 1;                            // intra-op threads (the bf16/fp16 GEMM workspace is per thread)
  bool cuda = false;                          // on a GPU: no CPU GEMM workspace
  // attention() runs the fused kernels (flash / memory-efficient: no T x T scores), as it does on
  // CUDA with libtorch >= 2 (attention_is_fused); else the explicit form.
  bool fused_attention = false;
  // Rows apart (data.packing packed / padded): the longest row a window holds. Each row's causal
  // scores are L x L, at most span x T per window (sum L_i^2 <= max L x sum L_i); 0 = T (one
  // sequence per window).
  int64_t attention_span = 0;
};

// One block's share of a micro-batch: blocks differ where some train and others do not
// (train.freeze, LoRA's targets), and the first block's input needs no gradient when nothing
// below it trains (a frozen embedding). Bytes; bwd_work relative to the start of its backward.
struct BlockBytes {
  int64_t saved = 0;      // saved by the block, its output included when the next block keeps it
  int64_t out_saved = 0;  // the part of saved that is the block's output
  int64_t bwd_work = 0;   // the peak of its backward beyond what is saved when it starts (may be < 0)
  bool backward = true;   // backward runs through it (something in it or below it trains)
};

// What autograd keeps and what a step allocates on top, for one micro-batch on one rank
// (bytes; "relative" terms are changes from the state at the start of a block's backward).
struct ActivationBytes {
  int64_t inputs = 0;          // the batch tensors
  int64_t embed_saved = 0;     // saved by the root before the first block
  int64_t embed_saved_rc = 0;  // the same under recomputation (besides the first block's input)
  std::vector<BlockBytes> blocks;  // one per block, first to last
  int64_t block_io = 0;        // one block's input (all recomputation keeps per block backward runs through)
  int64_t last_out_kept = 0;   // the last block's output, when the final norm keeps it (recomputation)
  int64_t grad_in = 0;         // the gradient entering a block
  int64_t head_saved = 0;      // saved by the final norm (and its output, when the head saves it)
  int64_t head_fwd_work = 0;   // logits and log-softmax at the peak of the loss
  int64_t head_bwd_work = 0;   // loss backward at its peak (before the root's gradient buffer)
  int64_t head_bwd_mm = 0;     // head projection backward: logits grad, input and weight grads
  int64_t final_norm_bwd = 0;  // the final norm's backward: its saved set, its output's gradient and its own work
  int64_t held_grad = 0;       // held through the whole backward (a tied embedding's head gradient)
  int64_t embed_bwd = 0;       // embedding gradients at the end of backward
  // The root's parameters used before the first block (embeddings) train: their gradients come at
  // the end of backward. If not, the root's trainable parameters (final norm, head) have all
  // their gradients before the blocks' backward starts.
  bool embedding_trains = true;
  // Saved activations of the whole forward, the batch included.
  int64_t saved(bool recompute) const;
};

// ---- per-layer costs (layers.cpp), for the architectures' activation_bytes ----------------------

// One micro-batch through a stack of transformer blocks.
struct ActivationShape {
  int64_t B = 1, T = 1, d = 1, f = 1, H = 1, hd = 1;
  int64_t b = 4;          // bytes of the compute dtype
  bool mixed = false;     // the compute dtype is not fp32
  bool norm32 = false;    // mixed precision with the blocks' norm weights kept in fp32
  bool causal = true;     // a causal mask (bool [T, T]) is saved
  bool fused = false;     // attention by the fused kernels (CostQuery::fused_attention)
  bool cuda = false;      // on a GPU (no CPU GEMM workspace)
  int threads = 1;
  int64_t span = 0;       // rows apart: the longest row (CostQuery::attention_span); 0 = T
  int64_t n() const { return B * T; }
  int64_t nd() const { return n() * d; }
  int64_t nf() const { return n() * f; }
  int64_t keys() const { return span > 0 ? std::min(span, T) : T; }  // scores per query, at most
  int64_t attn() const { return B * H * T * keys(); }
  // The causal masks' bytes: one [T, T] shared by the batch, or each row's own [L, L].
  int64_t causal_mask() const { return span > 0 ? B * T * keys() : T * T; }
};
// T tokens per sample; `block_norm_param`: the qualified name of a block's norm weight (whether
// q.keep_fp32 keeps the norms in fp32 under mixed precision).
ActivationShape activation_shape(const CostQuery& q, int64_t d, int64_t f, int64_t heads, int64_t T, bool causal,
                                 const std::string& block_norm_param);

// libtorch 1.13's bf16/fp16 GEMM on CPU packs its operands in a per-thread buffer (tensor
// memory); for a weight gradient with M rows reduced over the n tokens, all threads. fp32, or
// on a GPU: 0.
int64_t gemm_workspace_bytes(const ActivationShape& x, int64_t M);

// ---- what trains, and what a layer then saves ----------------------------------------------------
// libtorch 1.13 saves an op's input only when another of its inputs needs a gradient, so a frozen
// weight's layer keeps no input for it; a tensor that needs no gradient (nothing below it trains)
// is saved by nobody. Read from the built model (requires_grad, LoRA's adapters: model/lora.h).

// One linear layer: its weight trains (it saves its input for the weight's gradient), its bias
// trains, LoRA's rank on it (0: none) and whether LoRA's dropout is on (lora.dropout > 0).
struct LinearTraining {
  bool weight = true, bias = true;
  int64_t lora_rank = 0;
  bool lora_dropout = false;
  bool trains() const { return weight || bias || lora_rank > 0; }
};
// What parameter `name` of `module` (a dotted path below it) does: requires_grad; false if absent.
bool param_trains(const torch::nn::Module& module, const std::string& name);
// The linear layer at `path` below `module` (weight, bias, LoRA's lora_A.weight).
LinearTraining linear_training(const torch::nn::Module& module, const std::string& path, double lora_dropout);

// A linear layer x [n, in] -> [n, out] whose input does (in_rg) or does not need a gradient.
struct LinearCost {
  bool saves_input = false;  // it saves x (for its weight's gradient, or LoRA's lora_A)
  int64_t saved = 0;         // LoRA's own: A x [n, r] (saved by lora_B), dropout's noise and copy
  int64_t lora_low = 0;      // the A x part (released with lora_B's backward)
  bool out_rg = false;       // its output needs a gradient
};
LinearCost linear_cost(const ActivationShape& x, int64_t in, const LinearTraining& t, bool in_rg);

// A norm (RMSNorm, LayerNorm) whose input does (in_rg) or does not need a gradient and whose
// weight does or does not train: what it saves itself (not its input tensor, not its output:
// the next layers save that), whether it saves its input tensor itself (fp32 RMSNorm's x^2, a
// LayerNorm without an fp32 copy), and whether its output needs a gradient.
struct NormCost {
  int64_t saved = 0;
  bool keeps_input = false;
  bool out_rg = false;
};
NormCost rms_norm_cost(const ActivationShape& x, bool in_rg, bool weight_trains);
NormCost layer_norm_cost(const ActivationShape& x, bool in_rg, bool trains);
// The peak of a norm's backward (its input needing a gradient) beyond its saved set, its output
// and the incoming gradient: RMSNorm's fp32 temporaries, LayerNorm's input gradient (measured).
int64_t rms_norm_backward_bytes(const ActivationShape& x, bool weight_trains);
int64_t layer_norm_backward_bytes(const ActivationShape& x, bool trains);

// attention(q, k, v) for q, k, v that do or do not need gradients; the explicit form saves q', k',
// v' (bmm copies of the [B, H, T, hd] views), the fp32 softmax output (and its b-byte copy under
// mixed precision) and the causal mask; the fused kernels save q, k, v, the output and the
// logsumexp [B, H, T] (fp32). `bwd`: the peak of its own backward (explicit: softmax's fp32
// gradient in and out; fused: dq, dk, dv, the fp32 dq accumulator and the row sums); `held`:
// v's gradient waiting for q's and k's; `released`: what the later part of its backward has
// freed when that peak comes (the b-byte probabilities, v').
struct AttentionCost {
  int64_t saved = 0;
  int64_t released = 0;
  int64_t held = 0;
  int64_t bwd = 0;
  bool out_rg = false;
  bool output_saved = false;  // fused: its output is saved (then the merged heads are that tensor)
};
AttentionCost attention_cost(const ActivationShape& x, bool q_rg, bool k_rg, bool v_rg);

// maybe_dropout in training mode (p > 0) on both residual branches and the attention
// probabilities of a block: what it adds to the block's saved set (all of it released before the
// block's attention backward); the root adds the embedding dropout's noise.
int64_t dropout_saved(const ActivationShape& x, bool attn_branch_rg, bool mlp_branch_rg, bool scores_rg, bool v_rg);

// The pre-norm LayerNorm + attention + GELU-MLP block (GPT2Block, ViTBlock) with what trains in
// it: its norms (ln1, ln2: weight or bias) and its four linears (attention in and out, MLP in and
// out). `mlp_out_rows`: M of the MLP's second projection's weight gradient (Conv1D [f, d]: f;
// Linear [d, f]: d).
struct LayerNormBlockTraining {
  bool ln1 = true, ln2 = true;
  LinearTraining attn_in, attn_out, mlp_in, mlp_out;
};
// `in_rg`: the block's input needs a gradient; `next_norm_trains`: the norm after it (the next
// block's ln1, or the final norm) trains (a LayerNorm then keeps its input, this block's output).
BlockBytes layer_norm_block_costs(const ActivationShape& x, int64_t mlp_out_rows, const LayerNormBlockTraining& t,
                                  bool in_rg, bool next_norm_trains, bool dropout);
// Whether the block's output needs a gradient (in_rg or something in it trains).
bool layer_norm_block_out_rg(const LayerNormBlockTraining& t, bool in_rg);

// A language model's batch (token ids and targets), loss and LM head [V, d]: inputs,
// head_fwd_work, head_bwd_work, head_bwd_mm, held_grad and embed_bwd (the token embedding's).
// `head_trains`: the head's weight trains (a tied one: the embedding's); `embedding_trains`: the
// token embedding's; `in_rg`: the head's input needs a gradient.
void lm_head_costs(const ActivationShape& x, int64_t V, bool tied, bool head_trains, bool embedding_trains, bool in_rg,
                   ActivationBytes& a);

}  // namespace shardtrain::model
