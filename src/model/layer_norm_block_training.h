// What trains in one pre-norm LayerNorm block (GPT2Block, ViTBlock), read from the built module
// under the block's own parameter names: the one loop GPT-2's and ViT's activation_bytes share.
#pragma once
#include <torch/torch.h>

#include <string>

#include "shardtrain/model/costs.h"

namespace shardtrain::model {

// The block's parameter names: its two norms and its four linears, relative to the block.
struct LayerNormBlockNames {
  const char* ln1;
  const char* ln2;
  const char* attn_in;
  const char* attn_out;
  const char* mlp_in;
  const char* mlp_out;
};

// A LayerNorm trains when its weight or its bias does.
inline bool layer_norm_trains(const torch::nn::Module& m, const std::string& ln) {
  return param_trains(m, ln + ".weight") || param_trains(m, ln + ".bias");
}

inline LayerNormBlockTraining layer_norm_block_training(const torch::nn::Module& blk, const LayerNormBlockNames& n,
                                                        double lora_dropout) {
  LayerNormBlockTraining bt;
  bt.ln1 = layer_norm_trains(blk, n.ln1);
  bt.ln2 = layer_norm_trains(blk, n.ln2);
  bt.attn_in = linear_training(blk, n.attn_in, lora_dropout);
  bt.attn_out = linear_training(blk, n.attn_out, lora_dropout);
  bt.mlp_in = linear_training(blk, n.mlp_in, lora_dropout);
  bt.mlp_out = linear_training(blk, n.mlp_out, lora_dropout);
  return bt;
}

}  // namespace shardtrain::model
