// An adapter (LoRA) checkpoint out of the program: as a PEFT adapter directory, or merged into its
// base as a Hugging Face model directory, each rank merging and writing its rows of each tensor.
#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "hf_output.h"
#include "shardtrain/ckpt/base.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/peft.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/fsdp/nf4.h"
#include "shardtrain/fsdp/options.h"
#include "shardtrain/model/hf_config.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model_io/import.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/adapter_base.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/memory.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/names.h"
#include "spec_from_json.h"

namespace shardtrain::model_io {
namespace {

// What an adapter checkpoint holds, and the deck it was trained with.
struct Adapter {
  ckpt::CheckpointMeta meta;
  model::ModelSpec spec;
  std::unique_ptr<deck::Deck> deck;  // as trained: its checkpoint.init_from is the base
  std::map<std::string, at::Tensor> tensors;  // the trained parameters: adapters, lora.train_also
};

Adapter read_adapter(const std::string& path, const std::string& what) {
  Adapter a;
  a.meta = ckpt::read_checkpoint_meta(path);
  ST_USER_CHECK(!a.meta.base_json.empty(), what, ": ", path, " holds a whole model, not a LoRA adapter (written by a run "
                "with lora.rank = 0); export it with --format hf or safetensors");
  a.spec = model_spec_from_json(a.meta.model_spec_json, "checkpoint " + path);
  ST_USER_CHECK(a.spec.finetune.lora.on(), path, ": the model_spec of this adapter checkpoint has no LoRA rank");
  a.deck = std::make_unique<deck::Deck>(deck::Deck::parse(a.meta.deck_text, path + " (its resolved deck)", {}));
  for (auto& [name, t] : ckpt::read_model_tensors(path, expected_tensors(a.spec))) a.tensors[name] = t;
  return a;
}

bool plain_name(const std::string& t) {
  return t != "all-linear" && !is_glob(t) && t.find('.') == std::string::npos;
}

// adapter_config.json's target_modules: the deck's module names as they are when it gave plain
// names (PEFT matches them the same way), else the full names of the adapted layers (what PEFT
// >= 0.15 writes for "all-linear"); sorted. modules_to_save: the modules of lora.train_also's
// parameters, by full name.
ckpt::PeftConfig peft_config(const Adapter& a) {
  const model::LoraSpec& l = a.spec.finetune.lora;
  std::shared_ptr<model::Model> net = model::build_model(a.spec, at::kMeta);
  ckpt::PeftConfig c;
  c.r = l.rank;
  c.lora_alpha = l.alpha;
  c.lora_dropout = l.dropout;
  c.use_rslora = l.rslora;
  c.fan_in_fan_out = a.spec.arch == "gpt2";
  const std::vector<std::string> given = l.targets.empty() ? net->default_lora_targets() : l.targets;
  std::set<std::string> targets;
  if (std::all_of(given.begin(), given.end(), plain_name)) {
    targets.insert(given.begin(), given.end());
  } else {
    for (const model::LinearSite& s : model::linear_sites(*net))
      if (s.layer->has_lora()) targets.insert(s.path);
  }
  c.target_modules.assign(targets.begin(), targets.end());
  std::set<std::string> modules;
  for (const auto& [name, t] : a.tensors)
    if (!model::is_lora_param(name)) modules.insert(name.substr(0, name.rfind('.')));
  c.modules_to_save.assign(modules.begin(), modules.end());
  const std::string init_from = a.deck->get_string("checkpoint.init_from");
  c.base_model_name_or_path = init_from.empty() ? a.deck->get_string("model.from_hf") : init_from;
  return c;
}

}  // namespace

bool is_adapter_checkpoint(const std::string& path) { return !ckpt::read_checkpoint_meta(path).base_json.empty(); }

void export_peft_directory(const std::string& path, const std::string& out_dir) {
  const std::string what = "ckpt export --format peft";
  HfOutput output(out_dir, what);
  const Adapter a = read_adapter(path, what);
  const ckpt::PeftConfig c = peft_config(a);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : a.tensors) tensors.emplace_back(ckpt::peft_tensor_name(name), t);
  output.create();
  try {
    ckpt::write_safetensors(output.tmp() + "/" + ckpt::kPeftWeightsFile, tensors, what + " output");
    io::write_file_atomic(output.tmp() + "/" + ckpt::kPeftConfigFile, ckpt::peft_config_json(c));
    output.commit();
  } catch (...) {
    output.abandon();
    throw;
  }
  std::printf("exported %s -> %s: PEFT LoRA adapter (r %lld, alpha %g%s, %zu target modules, %zu tensors)%s\n",
              path.c_str(), out_dir.c_str(), static_cast<long long>(c.r), c.lora_alpha, c.use_rslora ? ", rslora" : "",
              c.target_modules.size(), tensors.size(),
              c.modules_to_save.empty() ? "" : (", modules_to_save " + std::to_string(c.modules_to_save.size())).c_str());
  std::fflush(stdout);
}

namespace {

// What a QLoRA adapter's merged export says of its base, on stdout and in its files' metadata.
std::string nf4_notice(const model::LoraSpec& l) {
  return "merged into the NF4 base dequantized (block " + std::to_string(l.nf4_block) +
         (l.nf4_double_quant ? ", double-quantized" : "") + "): the merged model is not the full-precision base + adapter";
}

// One output tensor: where its bytes go and which rows this rank writes.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t file = 0;
  int64_t offset = 0;  // of its data in the file (header included)
  int64_t rows = 1, cols = 1;
};

void pwrite_all(int fd, const void* data, int64_t n, int64_t off, const std::string& path) {
  auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)), off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError(path + ": write failed: " + io::errno_text(errno));
    p += w;
    n -= w;
    off += w;
  }
}

}  // namespace

void export_merged_hf_directory(MPI_Comm world, const std::string& path, const std::string& out_dir,
                                const HfExportOptions& o) {
  const std::string what = "ckpt export --format hf";
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  // Every rank reads the adapter (small), the layout and the base's headers; they agree on errors.
  std::unique_ptr<HfOutput> output;
  Adapter a;
  model::ModelSpec base_spec;
  std::string dtype, init_from;
  std::vector<OutTensor> out;
  std::vector<std::string> files;
  std::vector<std::string> headers;  // per file: the 8-byte length and the JSON header
  std::vector<int64_t> file_bytes;
  ckpt::BaseIdentity recorded;
  std::unique_ptr<ckpt::SafetensorsReader> base;
  std::shared_ptr<model::Model> net;  // the model on meta: init rules of a seeded base
  std::set<std::string> nf4_names;      // QLoRA: the base tensors the run held as NF4
  runtime::run_agreed(world, [&] {
    output = std::make_unique<HfOutput>(out_dir, what);
    a = read_adapter(path, what);
    ST_USER_CHECK(a.spec.arch == "llama", what, ": ", path, " holds a ", a.spec.arch,
                  " model; a Hugging Face directory is written for the llama arch (Llama, Mistral, Qwen2)");
    recorded = ckpt::BaseIdentity::parse(a.meta.base_json, "checkpoint " + path);
    dtype = choose_hf_dtype(o.dtype, a.deck.get(), a.spec);
    base_spec = a.spec;
    base_spec.finetune = model::Finetune{};  // the merged model is the base architecture
    model::hf_config_json(base_spec, torch_dtype_name(dtype));  // its errors before any file
    net = model::build_model(a.spec, at::kMeta);
    if (a.spec.finetune.lora.nf4())
      for (const std::string& n : model::nf4_base_params(*net)) nf4_names.insert(n);
    init_from = a.deck->get_string("checkpoint.init_from");
    if (!init_from.empty()) base = std::make_unique<ckpt::SafetensorsReader>(init_from);
    const int eb = dtype == "F32" ? 4 : 2;
    std::vector<int64_t> bytes;
    for (const ckpt::ExpectedTensor& t : expected_tensors(base_spec)) {
      OutTensor ot;
      ot.name = t.name;
      ot.shape = t.shape;
      int64_t n = 1;
      for (int64_t s : t.shape) n *= s;
      ot.rows = t.shape.empty() ? 1 : t.shape[0];
      ot.cols = ot.rows ? n / ot.rows : 0;
      if (base && !a.tensors.count(t.name)) {
        const ckpt::SafetensorsEntry* e = base->find(t.name);
        ST_USER_CHECK(e, what, ": the base ", init_from, " (checkpoint.init_from) has no tensor '", t.name, "'");
        ST_USER_CHECK(e->shape == t.shape, what, ": the base's tensor '", t.name, "' does not have the model's shape");
      }
      bytes.push_back(n * eb);
      out.push_back(ot);
    }
    const std::vector<std::vector<size_t>> groups = ckpt::safetensors_shard_groups(bytes, o.max_shard_bytes);
    for (size_t fi = 0; fi < groups.size(); ++fi) {
      files.push_back(ckpt::safetensors_shard_file(fi, groups.size()));
      nlohmann::ordered_json header;
      header["__metadata__"] = {{"format", "pt"}};
      if (!nf4_names.empty()) header["__metadata__"]["lora_merge"] = nf4_notice(a.spec.finetune.lora);
      int64_t offset = 0;
      for (size_t i : groups[fi]) {
        header[out[i].name] = {{"dtype", dtype}, {"shape", out[i].shape}, {"data_offsets", {offset, offset + bytes[i]}}};
        out[i].file = fi;
        out[i].offset = offset;
        offset += bytes[i];
      }
      std::string h = header.dump();
      h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors writes it
      std::string le(8, '\0');
      for (int k = 0; k < 8; ++k) le[k] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * k));
      for (size_t i : groups[fi]) out[i].offset += 8 + static_cast<int64_t>(h.size());
      headers.push_back(le + h);
      file_bytes.push_back(8 + static_cast<int64_t>(h.size()) + offset);
    }
  });

  // Rank 0 makes the directory and the files at their full sizes; every rank then writes its rows.
  std::string tmp;
  runtime::run_agreed(world, [&] {
    if (rank != 0) return;
    output->create();
    tmp = output->tmp();
    for (size_t fi = 0; fi < files.size(); ++fi) {
      const std::string f = tmp + "/" + files[fi];
      const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd < 0) throw IoError(f + ": cannot create: " + io::errno_text(errno));
      const int err = ::ftruncate(fd, file_bytes[fi]) == 0 ? 0 : errno;
      try {
        if (err) throw IoError(f + ": cannot size it (" + io::errno_text(err) + ")");
        pwrite_all(fd, headers[fi].data(), static_cast<int64_t>(headers[fi].size()), 0, f);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
  });
  runtime::broadcast(world, tmp, 0, "export.directory");
  output->adopt(tmp);
  try {
    const model::LoraSpec& lora = a.spec.finetune.lora;
    const double scale = lora.scale();
    const int eb = dtype == "F32" ? 4 : 2;
    // The base's digests as the run held it (fsdp.param_dtype, widened; NF4 weights dequantized):
    // the checkpoint's record.
    const at::ScalarType held =
        fsdp::parse_dtype(recorded.dtype.empty() ? "fp32" : ckpt::base_param_dtype(recorded.dtype));
    std::vector<uint64_t> digests(2 * out.size(), 0);
    const uint64_t seed = static_cast<uint64_t>(a.deck->get_int("run.seed"));
    std::vector<int> fds(files.size(), -1);
    struct Close {
      std::vector<int>& fds;
      ~Close() { for (int fd : fds) if (fd >= 0) ::close(fd); }
    } close_all{fds};
    runtime::run_agreed(world, [&] {
      for (size_t fi = 0; fi < files.size(); ++fi) {
        const std::string f = tmp + "/" + files[fi];
        fds[fi] = ::open(f.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fds[fi] < 0) throw IoError(f + ": cannot open: " + io::errno_text(errno));
      }
    });
    for (size_t i = 0; i < out.size(); ++i) {
      const OutTensor& t = out[i];
      const int64_t r0 = t.rows * rank / size, r1 = t.rows * (rank + 1) / size, n = t.rows * t.cols;
      const auto trained = a.tensors.find(t.name);
      // QLoRA: a weight the run held as NF4 is merged as the run computed with it, bitsandbytes'
      // round trip of the whole tensor (nf4.h) cast to fsdp.param_dtype. Its blocks run row-major
      // over the whole tensor: this rank quantizes the blocks [f0, f1) that cover its rows (a part
      // starting at a block boundary gets the whole tensor's codes). With double quantization the
      // statistics need every block's absmax (their mean, their blocks of 256): each rank's, then
      // their maximum over the ranks (1/64 of the tensor's elements; a block two ranks share has
      // the same absmax on both), double-quantized whole on every rank.
      const bool nf4 = trained == a.tensors.end() && nf4_names.count(t.name) > 0;
      const int64_t block = lora.nf4_block;
      int64_t f0 = 0, f1 = 0;
      fsdp::nf4::Codes codes;
      std::vector<double> absmax(nf4 && lora.nf4_double_quant ? fsdp::nf4::num_blocks(n, block) : 0, 0.0);
      at::Tensor w;  // this rank's rows, fp32
      runtime::run_agreed(world, [&] {
        if (r1 <= r0) return;
        if (trained != a.tensors.end()) {
          w = trained->second.reshape({t.rows, t.cols}).narrow(0, r0, r1 - r0).contiguous();
          return;
        }
        at::Tensor full;  // a seeded base: run.seed's init, as the engine draws it (whole)
        auto read = [&](int64_t first, int64_t count) {
          if (base) return base->read(t.name, first, count);
          if (!full.defined()) {
            full = at::empty(t.shape, at::TensorOptions().dtype(at::kFloat));
            model::init_parameter(full, net->init_rule(t.name), model::param_seed(seed, t.name));
          }
          return full.reshape({n}).narrow(0, first, count).contiguous();
        };
        if (!nf4) {
          w = read(r0 * t.cols, (r1 - r0) * t.cols).view({r1 - r0, t.cols});
          return;
        }
        f0 = r0 * t.cols / block * block;
        f1 = std::min(fsdp::nf4::num_blocks(r1 * t.cols, block) * block, n);
        codes = fsdp::nf4::quantize(read(f0, f1 - f0), block);
        if (!absmax.empty()) {
          const at::Tensor mine = codes.absmax.to(at::kDouble).contiguous();
          std::copy(mine.data_ptr<double>(), mine.data_ptr<double>() + mine.numel(), absmax.begin() + f0 / block);
        }
      });
      if (!absmax.empty()) runtime::max(world, absmax, "export.nf4_absmax");
      runtime::run_agreed(world, [&] {
        if (r1 <= r0) return;
        if (nf4) {
          if (!absmax.empty()) {
            const at::Tensor whole =
                at::from_blob(absmax.data(), {static_cast<int64_t>(absmax.size())}, at::TensorOptions().dtype(at::kDouble))
                    .to(at::kFloat);
            const at::Tensor dq = fsdp::nf4::dequantize_absmax(fsdp::nf4::quantize_absmax(whole));
            codes.absmax = dq.narrow(0, f0 / block, codes.absmax.numel()).contiguous();
          }
          w = fsdp::nf4::dequantize(codes, f1 - f0, block, held)
                  .narrow(0, r0 * t.cols - f0, (r1 - r0) * t.cols)
                  .to(at::kFloat)
                  .contiguous()
                  .view({r1 - r0, t.cols});
        }
        if (trained == a.tensors.end()) {
          const at::Tensor as_held = held == at::kFloat ? w : w.to(held).to(at::kFloat).contiguous();
          ckpt::Digest dg;
          dg.add(as_held.data_ptr<float>(), as_held.numel(), 4, r0 * t.cols);
          digests[2 * i] = dg.sum;
          digests[2 * i + 1] = dg.weighted;
        }
        // An adapted layer: W + s B A over these rows (PEFT's merge), in fp64 with the sum over the
        // rank in a fixed order and one rounding at the end: every element comes out the same
        // whichever rows a rank merges (a GEMM's blocking would depend on them).
        const std::string layer = t.name.size() > 7 ? t.name.substr(0, t.name.size() - 7) : "";
        auto A = a.tensors.find(layer + ".lora_A.weight"), B = a.tensors.find(layer + ".lora_B.weight");
        if (t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0 && A != a.tensors.end() &&
            B != a.tensors.end()) {
          const at::Tensor b = B->second.narrow(0, r0, r1 - r0).to(at::kDouble), av = A->second.to(at::kDouble);
          at::Tensor delta = at::zeros({r1 - r0, t.cols}, at::TensorOptions().dtype(at::kDouble));
          for (int64_t k = 0; k < av.size(0); ++k) delta.add_(b.narrow(1, k, 1) * av.narrow(0, k, 1));
          w = (w.to(at::kDouble) + delta * scale).to(at::kFloat);
        }
        const at::Tensor bytes = ckpt::narrow_for_export(w, t.name, dtype, o.allow_overflow);
        pwrite_all(fds[t.file], bytes.data_ptr(), bytes.numel() * eb, t.offset + r0 * t.cols * eb,
                   tmp + "/" + files[t.file]);
      });
    }
    runtime::run_agreed(world, [&] {
      for (size_t fi = 0; fi < files.size(); ++fi)
        if (::fdatasync(fds[fi]) != 0) throw IoError(tmp + "/" + files[fi] + ": sync failed: " + io::errno_text(errno));
    });
    runtime::sum(world, digests, "export.base_digests");
    std::vector<uint64_t> peak(static_cast<size_t>(size), 0);
    peak[static_cast<size_t>(rank)] = static_cast<uint64_t>(read_process_memory().hwm_bytes);
    runtime::sum(world, peak, "export.peak_memory");
    runtime::run_agreed(world, [&] {
      if (rank != 0) return;
      // The base read is the one the adapter was trained on (checked before anything is visible).
      ckpt::BaseIdentity now;
      now.source = init_from.empty() ? "run.seed = " + std::to_string(seed) : init_from;
      now.dtype = recorded.dtype.empty() ? "" : ckpt::base_dtype_text(ckpt::base_param_dtype(recorded.dtype),
                                                                     lora.nf4() ? lora.nf4_block : 0, lora.nf4_double_quant);
      for (size_t i = 0; i < out.size(); ++i)
        if (!a.tensors.count(out[i].name)) now.digests[out[i].name] = ckpt::Digest{digests[2 * i], digests[2 * i + 1]};
      const std::string diff = recorded.differences(now);
      ST_USER_CHECK(diff.empty(), path, ": cannot merge this LoRA adapter into another base: it was ", diff,
                    ". Set checkpoint.init_from in its deck to the base it was trained on");
      if (files.size() > 1) {
        nlohmann::ordered_json index;
        nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
        int64_t data = 0;
        for (const OutTensor& t : out) {
          weight_map[t.name] = files[t.file];
          int64_t n = eb;
          for (int64_t s : t.shape) n *= s;
          data += n;
        }
        index["metadata"] = {{"total_size", data}};
        index["weight_map"] = weight_map;
        io::write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
        files.push_back("model.safetensors.index.json");
      }
      const std::string source = o.tokenizer_from.empty() ? train::hf_model_source(*a.deck) : o.tokenizer_from;
      const std::vector<std::string> side = write_hf_side_files(tmp, base_spec, dtype, source, !o.tokenizer_from.empty());
      files.insert(files.end(), side.begin(), side.end());
      output->commit();
      uint64_t most = 0;
      for (uint64_t p : peak) most = std::max(most, p);
      if (!nf4_names.empty()) std::printf("# %s\n", nf4_notice(lora).c_str());
      std::printf("exported %s -> %s: merged LoRA adapter (r %lld, scale %g) into its base (%s), %s, %d rank%s "
                  "(peak resident memory per rank %.1f MiB at most), %zu files:",
                  path.c_str(), out_dir.c_str(), static_cast<long long>(lora.rank), scale, now.source.c_str(),
                  dtype.c_str(), size, size == 1 ? "" : "s", static_cast<double>(most) / (1 << 20), files.size());
      for (const std::string& f : files) std::printf(" %s", f.c_str());
      std::printf("\n");
      std::fflush(stdout);
    });
  } catch (...) {
    if (rank == 0) output->abandon();
    throw;
  }
}

}  // namespace shardtrain::model_io
