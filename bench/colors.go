package bench

import "image/color"

// palette colours endpoints in the chart: berth first.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// floorColor marks the floors, whatever the number of endpoints.
var floorColor = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
