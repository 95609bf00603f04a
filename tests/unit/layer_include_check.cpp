// One translation unit, compiled by tests/unit/layers.cmake inside different layers' targets:
// it includes SHARDTRAIN_CHECK_HEADER, which must compile exactly where the layer graph allows it.
#include SHARDTRAIN_CHECK_HEADER

int shardtrain_layer_include_check() { return 0; }
