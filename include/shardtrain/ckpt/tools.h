// Offline tools on checkpoint files: inspect, consolidate, safetensors export/import.
#pragma once
#include <mpi.h>

#include <functional>
#include <map>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/fsdp/engine.h"

namespace shardtrain::ckpt {

// Prints metadata and every dataset (path, shape, dtype, bytes). One process.
void inspect_checkpoint(const std::string& path, std::ostream& out);
// A serial copy of the whole checkpoint (plain sec2 file, contiguous datasets), after
// verifying its digests. One process.
void consolidate_checkpoint(const std::string& path, const std::string& out_path);
// One parameter a checkpoint must hold: its name (as in the model) and shape.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// Before a model a checkpoint describes is allocated: its /model datasets are exactly
// `expected` (names, float32, shapes) and their data fits in the file, so a crafted
// description (a deck or model_spec claiming a huge model) is refused instead of allocated.
// UserError naming the first difference. Reads no data. One process.
void check_model_datasets(const std::string& path, const std::vector<ExpectedTensor>& expected);
// The /model datasets as a safetensors file (F32, names as in the model, which are the
// Hugging Face names for GPT-2). Digests are checked while reading. One process. With
// `expected` (the model the checkpoint says it holds), a missing, misshaped or extra
// parameter is a UserError naming the tensor, and nothing is written.
void export_safetensors(const std::string& path, const std::string& out_path,
                        const std::vector<ExpectedTensor>* expected = nullptr);

// The /model datasets as Hugging Face safetensors files in `dir` (an existing directory the
// caller created and owns): the tensors of `expected`, in its order, checked as above and
// converted to `dtype` (F32; BF16 / F16 rounded to nearest even); files of at most
// max_shard_bytes of tensor data (a larger tensor alone): "model.safetensors" when one file
// holds everything, else "model-0000i-of-0000n.safetensors" and "model.safetensors.index.json"
// ({"metadata": {"total_size"}, "weight_map"}). Every file is written as an io::OutputFile (an
// exclusive temporary, never through a link, fsynced, renamed). Returns the file names. One process.
// A finite value the dtype cannot hold (beyond fp16's 65504, bf16's 3.39e38: it would become inf,
// which import refuses) is a UserError naming the tensor and the dtype, or with `allow_overflow`
// is written as the dtype's largest finite value of its sign (a warning counts them).
std::vector<std::string> write_safetensors_shards(const std::string& path, const std::string& dir,
                                                  const std::vector<ExpectedTensor>& expected, const std::string& dtype,
                                                  int64_t max_shard_bytes, bool allow_overflow = false);
// UserError when writing `out` (or its temporary `out`.tmp) would overwrite one of `inputs`
// (same file by std::filesystem::equivalent: links and other spellings included), or when
// `out` is a directory. `what` names the command for the message ("ckpt export").
void refuse_overwriting_inputs(const std::string& out, const std::vector<std::string>& inputs,
                               const std::string& what);

// fp32 values rounded (to nearest even) into an export's dtype (F32, BF16, F16) under the rule of
// write_safetensors_shards: a finite value the dtype cannot hold is a UserError naming `name` and
// the dtype, or with allow_overflow the dtype's largest finite value of its sign.
at::Tensor narrow_for_export(const at::Tensor& f32, const std::string& name, const std::string& dtype,
                             bool allow_overflow);

// How a Hugging Face model's tensors of `bytes` each (in model order) are split into files of at
// most max_shard_bytes of data (a larger tensor alone), as transformers' save_pretrained does;
// and the name of file i of n ("model.safetensors" when n == 1).
std::vector<std::vector<size_t>> safetensors_shard_groups(const std::vector<int64_t>& bytes, int64_t max_shard_bytes);
std::string safetensors_shard_file(size_t i, size_t n);

// The /model datasets `expected` names (nothing else may be there), read whole in fp32 with
// their digests checked: small checkpoints only (an adapter checkpoint's adapters). One process.
std::vector<std::pair<std::string, at::Tensor>> read_model_tensors(const std::string& path,
                                                                    const std::vector<ExpectedTensor>& expected);
// A safetensors file of F32 tensors in the given order (header metadata {"format": "pt"}),
// written atomically. `what` names the file in errors.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::string& what);

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets in the file (absolute, header included)
};
// Parses and validates the header (length, JSON, offsets inside the file, sizes that match
// shapes and dtypes). UserError naming the file on any problem.
std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path);

// The files of a safetensors source: a .safetensors file; a Hugging Face index
// (`model.safetensors.index.json`, its weight_map naming files in the same directory); or a
// directory holding `model.safetensors` or that index. A directory with both is read as
// transformers reads it: `model.safetensors`, the index ignored. UserError naming what is wrong.
std::vector<std::string> safetensors_files(const std::string& path);
// Whether `dir` is a directory with weights safetensors_files reads (model.safetensors or the index).
bool has_safetensors_weights(const std::string& dir);

// The elements of the floating-point tensors of a safetensors source, all files together: the
// most parameters a model read from it can have (headers only; each checked as above).
int64_t safetensors_float_values(const std::string& path);

// A safetensors source against the parameters of a model (`expected`, each once): every one
// present with a floating-point dtype and its shape, no tensor in two files. UserError naming the
// first tensor that is missing, not float or misshaped. Headers only: no data is read and nothing
// allocated, so it can run before the model is. `extra`: the tensors that are no expected
// parameter. `what` names the source in errors ("safetensors", "PEFT adapter").
struct SafetensorsMatch {
  std::vector<std::string> files;
  std::map<std::string, std::pair<size_t, SafetensorsEntry>> entries;  // name -> (index in files, entry)
  std::vector<std::string> extra;
};
SafetensorsMatch match_safetensors(const std::string& path, const std::vector<ExpectedTensor>& expected,
                                   const std::string& what = "safetensors");

// A safetensors source (anything safetensors_files accepts) read by slices: the headers are read
// and checked once; read() preads elements [first, first + n) of one flattened tensor and widens
// them to fp32. One process; UserError naming the file.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  at::Tensor read(const std::string& name, int64_t first, int64_t n) const;

 private:
  std::string path_;
  std::vector<std::string> files_;
  mutable std::vector<int> fds_;  // opened on first read
  std::map<std::string, std::pair<size_t, SafetensorsEntry>> entries_;  // name -> (file, entry)
};

// Collective over world: every rank reads only its shards' slices (by file offset) of
// every parameter of the engine from a safetensors file (F32, or BF16/F16/F64 widened to the
// fp32 masters). Missing tensors, non-float dtypes or wrong
// shapes are a UserError on every rank; "lm_head.weight" is skipped when the model has no
// such parameter (GPT-2 ties it to the token embedding); other extras are listed in a
// warning. Marks parameters updated.
// `path` is any source safetensors_files accepts (sharded Hugging Face checkpoints included).
// `pick` chooses what is read: a base for LoRA (its adapters are not in it), a PEFT adapter file
// (its own names, and nothing else in it).
struct TensorPick {
  std::function<bool(const std::string& param)> wanted;          // empty: every parameter
  std::function<std::string(const std::string& param)> in_file;  // the parameter's name in the file; empty: the same
  bool extras_are_errors = false;  // a tensor of the file that is no wanted parameter: UserError, not a warning
  std::string what = "safetensors";  // how errors name the source ("PEFT adapter")
};
void load_safetensors(const std::string& path, fsdp::Engine& engine, MPI_Comm world, const TensorPick& pick = {});

}  // namespace shardtrain::ckpt
