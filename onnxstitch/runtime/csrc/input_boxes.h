// Input boxes (docs/abi.md, attribute `input_boxes`): an input the kernel reads as a box of the
// tensor bound to it — one axis cut to [start, stop), a folded Slice/Split. The box's shape
// takes part in the iteration shape; the kernel gets the tensor's own strides and a pointer to
// the box's first element. Input windows (attribute `input_windows`): an input read in one
// operand's window of a stitched Concat — its element j along the axis is the iteration's
// origin + j; it counts as the Concat's size (total) along the axis for the iteration shape,
// and the kernel gets a pointer `origin` elements before its first (it loads only inside the
// window). The same code serves Compute (numbers) and shape inference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxstitch {

struct InputBox {
  bool present = false;
  int64_t axis = 0, start = 0, stop = 0;
};

// Parses (axis, start, stop) per input, axis -1 for an input read whole; false (with *error)
// when malformed. An absent attribute (empty `attr`) reads every input whole.
inline bool ParseInputBoxes(const std::vector<int64_t>& attr, size_t n_in, std::vector<InputBox>* out,
                            std::string* error) {
  out->assign(n_in, InputBox{});
  if (attr.empty()) return true;
  if (attr.size() != 3 * n_in) {
    *error = "input_boxes has " + std::to_string(attr.size()) + " values; 3 per input (" +
             std::to_string(3 * n_in) + ") expected";
    return false;
  }
  for (size_t i = 0; i < n_in; ++i) {
    const int64_t axis = attr[3 * i], start = attr[3 * i + 1], stop = attr[3 * i + 2];
    if (axis == -1) continue;
    if (axis < 0 || axis >= 8 || start < 0 || stop < start) {
      *error = "input_boxes entry " + std::to_string(i) + " must be (-1, 0, 0) or (axis 0..7, start >= 0, stop >= start)";
      return false;
    }
    (*out)[i] = InputBox{true, axis, start, stop};
  }
  return true;
}

struct InputWindow {
  bool present = false;
  int64_t axis = 0, origin = 0, size = 0, total = 0;
};

// Parses (axis, origin, size, total) per input, axis -1 for an input read unshifted; false
// (with *error) when malformed. An absent attribute (empty `attr`) shifts no input.
inline bool ParseInputWindows(const std::vector<int64_t>& attr, size_t n_in, std::vector<InputWindow>* out,
                              std::string* error) {
  out->assign(n_in, InputWindow{});
  if (attr.empty()) return true;
  if (attr.size() != 4 * n_in) {
    *error = "input_windows has " + std::to_string(attr.size()) + " values; 4 per input (" +
             std::to_string(4 * n_in) + ") expected";
    return false;
  }
  for (size_t i = 0; i < n_in; ++i) {
    const int64_t* w = &attr[4 * i];
    if (w[0] == -1) continue;
    if (w[0] < 0 || w[0] >= 8 || w[1] < 0 || w[2] < 0 || w[1] + w[2] > w[3]) {
      *error = "input_windows entry " + std::to_string(i) +
               " must be (-1, 0, 0, 0) or (axis 0..7, origin >= 0, size >= 0, total >= origin + size)";
      return false;
    }
    (*out)[i] = InputWindow{true, w[0], w[1], w[2], w[3]};
  }
  return true;
}

// Bytes per element of an ONNX tensor element type the kernels read (0 if none of them).
inline int64_t ElementBytes(int type) {
  switch (type) {
    case 1: case 6: case 12: return 4;           // float, int32, uint32
    case 7: case 11: case 13: return 8;          // int64, double, uint64
    case 10: case 16: case 5: case 4: return 2;  // float16, bfloat16, int16, uint16
    case 2: case 3: case 9: return 1;            // uint8, int8, bool
    default: return 0;
  }
}

}  // namespace onnxstitch
