// The identity of the data a run trains on, recorded in its checkpoints (/train extra "data")
// and compared at resume: a resume on a replaced, truncated or other dataset is refused
// (checkpoint.allow_data_change = true makes it a warning in the log and the metrics).
#pragma once
#include <string>

namespace shardtrain::data {

// JSON text: for a dataset directory, each regular *.bin, *.rows and *.json file directly in it
// (the split files, row boundaries and meta.json of a token dataset, the files of an image
// dataset) with its size and a digest (FNV-1a 64) of its first and last MiB, and `windows` (how
// the split becomes windows: data.packing with its keys, "" = not recorded); {"kind":"synthetic"}
// for synthetic items (dataset_dir empty). Reads at most 2 MiB per file: cheap at every start.
std::string data_identity(const std::string& dataset_dir, const std::string& windows = "");

// "" when `now` describes the same data as `saved` (both data_identity texts); otherwise what
// changed, one clause per file ("train.bin: 40960 -> 20480 bytes", "val.bin: content differs",
// "meta.json: missing now", "windows: packed -> stream"; windows compared when both record them).
std::string data_identity_differences(const std::string& saved, const std::string& now);

}  // namespace shardtrain::data
