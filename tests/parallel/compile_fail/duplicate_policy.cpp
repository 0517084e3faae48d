// Must not compile: data parallelism named twice.
#include <telar/parallel/strategy.hpp>

int main() {
  telar::Strategy<telar::DataParallel<>, telar::PipelineParallel<>,
                  telar::DataParallel<telar::MpiAllreduce>>
      s;
}
