// Must not compile: a SlabGraph's precision is its layers' policies, so a
// Precision in the strategy given to SlabDataParallel would be ignored.
#include <telar/parallel/slab_data_parallel.hpp>
#include <telar/parallel/spatial_unet.hpp>

int main() {
  using Graph = telar::SpatialUNetLayers<float, Kokkos::HostSpace>::Graph;
  using S = telar::Strategy<telar::DataParallel<>, telar::SpatialParallel,
                            telar::Precision<telar::bf16, float>>;
  using Update = telar::SlabDataParallel<Graph, S>;
  return sizeof(typename Update::data_parallel) > 0 ? 0 : 1;
}
