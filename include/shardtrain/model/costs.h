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

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::model {

// How one micro-batch runs, as far as its memory is concerned.
struct CostQuery {
  int64_t micro_batch = 1;                    // samples per forward
  at::ScalarType compute_dtype = at::kFloat;  // dtype of the unsharded parameters and the computation
  std::vector<std::string> keep_fp32;         // parameter-name patterns kept fp32 under mixed precision
  int threads = 1;                            // intra-op threads (the bf16/fp16 GEMM workspace is per thread)
};

// What autograd keeps and what a step allocates on top, for one micro-batch on one rank
// (bytes; "relative" terms are changes from the state at the start of a block's backward).
struct ActivationBytes {
  int64_t inputs = 0;          // the batch tensors
  int64_t embed_saved = 0;     // saved by the root before the first block
  int64_t embed_saved_rc = 0;  // the same under recomputation (besides the first block's input)
  int64_t block_saved = 0;     // saved per block, its output included when the next block keeps it
  int64_t block_out_saved = 0; // the part of block_saved that is the block's output
  int64_t block_io = 0;        // one block's input (all recomputation keeps per block)
  int64_t last_out_kept = 0;   // the last block's output, when the final norm keeps it (recomputation)
  int64_t norm_saved = 0;      // one norm's saved tensors
  int64_t grad_in = 0;         // the gradient entering a block
  int64_t block_bwd_mlp = 0;   // relative: the peak of the block's MLP backward
  int64_t block_bwd_attn = 0;  // relative: the peak of its attention backward (may be < 0)
  int64_t head_saved = 0;      // saved by the final norm
  int64_t head_fwd_work = 0;   // logits and log-softmax at the peak of the loss
  int64_t head_bwd_work = 0;   // loss backward at its peak (before the root's gradient buffer)
  int64_t head_bwd_mm = 0;     // head projection backward: logits grad, input and weight grads
  int64_t held_grad = 0;       // held through the whole backward (a tied embedding's head gradient)
  int64_t embed_bwd = 0;       // embedding gradients at the end of backward
  int64_t gemm_ws = 0;         // bf16/fp16 weight-gradient GEMM workspace (libtorch's blocked kernel), all threads
  int64_t blocks = 0;          // number of blocks
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
  int threads = 1;
  int64_t n() const { return B * T; }
  int64_t nd() const { return n() * d; }
  int64_t nf() const { return n() * f; }
  int64_t attn() const { return B * H * T * T; }
};
// T tokens per sample; `block_norm_param`: the qualified name of a block's norm weight (whether
// q.keep_fp32 keeps the norms in fp32 under mixed precision).
ActivationShape activation_shape(const CostQuery& q, int64_t d, int64_t f, int64_t heads, int64_t T, bool causal,
                                 const std::string& block_norm_param);

// libtorch 1.13's bf16/fp16 GEMM on CPU packs its operands in a per-thread buffer (tensor
// memory); for a weight gradient with M rows reduced over the n tokens, all threads. fp32: 0.
int64_t gemm_workspace_bytes(const ActivationShape& x, int64_t M);

// The pre-norm LayerNorm + attention + GELU-MLP block (GPT2Block, ViTBlock): fills block_saved,
// block_out_saved, block_io, grad_in, norm_saved, head_saved (the final LayerNorm), gemm_ws,
// block_bwd_mlp, block_bwd_attn and last_out_kept. `mlp_out_rows`: M of the MLP's second
// projection's weight gradient (Conv1D [f, d]: f; Linear [d, f]: d). Returns whether a norm keeps
// its input tensor itself (then the embedding output stays alive too).
bool layer_norm_block_costs(const ActivationShape& x, int64_t mlp_out_rows, ActivationBytes& a);
// LayerNorm's saved tensors (a block's, or the final norm's), and whether it keeps its input.
int64_t layer_norm_saved(const ActivationShape& x);
bool layer_norm_keeps_input(const ActivationShape& x);
// RMSNorm's saved tensors (LlamaDecoderLayer, Llama's final norm), and whether it keeps its input.
int64_t rms_norm_saved(const ActivationShape& x);
bool rms_norm_keeps_input(const ActivationShape& x);
// attention(): q', k', v' (bmm copies of the [B, H, T, hd] views), the merged heads, the fp32
// softmax output (and its b-byte copy under mixed precision), the causal mask.
int64_t attention_saved(const ActivationShape& x);
// The b-byte copy of the probabilities bmm saves under mixed precision (0 in fp32).
int64_t attention_probs_copy(const ActivationShape& x);
// Softmax backward: fp32 gradient in and out.
int64_t softmax_backward_bytes(const ActivationShape& x);
// maybe_dropout in training mode (p > 0) on both residual branches and the attention
// probabilities of every block and on the embeddings: adds to block_saved, embed_saved(_rc) and
// takes from block_bwd_attn (all of it is released before the block's softmax backward).
void dropout_costs(const ActivationShape& x, ActivationBytes& a);
// A language model's batch (token ids and targets), loss and LM head [V, d]: inputs,
// head_fwd_work, head_bwd_work, head_bwd_mm, held_grad and embed_bwd (the token embedding's).
void lm_head_costs(const ActivationShape& x, int64_t V, bool tied, ActivationBytes& a);

}  // namespace shardtrain::model
